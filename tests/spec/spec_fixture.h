// The tiny fixture models for the speculative decoding tests: loading, the fixture prompt, a
// non-speculative greedy reference computed straight on the engine (no scheduler), and a drafter
// wrapper that proposes a known continuation with deliberate mistakes, so that full acceptance,
// partial acceptance (rollback in the middle of a verify) and rejection all occur — the tiny
// model's own random-weight drafter is never right.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/spec/cpu_backend.h"
#include "sched/scheduler.h"

namespace dsv41::test_support {

inline std::string fixture_dir(const std::string& name) { return std::string(DSV41_FIXTURES_DIR) + "/" + name; }

inline std::vector<int32_t> golden_ids(const std::string& fixture, const std::string& key) {
  auto f = SafetensorsFile::open(fixture_dir(fixture) + "/golden.safetensors");
  const TensorInfo* t = f->find(key);
  std::vector<int32_t> v(static_cast<size_t>(t->numel()));
  std::memcpy(v.data(), t->data, v.size() * 4);
  return v;
}

inline std::unique_ptr<model::CpuModel> load_tiny(const std::string& fixture) {
  model::CpuModelOptions o;
  o.engram_token_map = fixture_dir(fixture) + "/engram_token_map.safetensors";
  return model::CpuModel::load(fixture_dir(fixture) + "/model", o);
}

// Greedy tokens after `prompt` by one-shot prefill and one-token decode steps on the engine
// itself (the fixtures' stepping rule), no scheduler, no speculation. M: CpuModel or CudaModel.
template <class M>
std::vector<int32_t> engine_greedy(M& m, const std::vector<int32_t>& prompt, int64_t n) {
  auto st = m.new_sequence();
  st->prompt_len = static_cast<int64_t>(prompt.size());
  std::vector<float> lg;
  m.forward_sequence(*st, prompt, false, &lg);
  std::vector<int32_t> out;
  while (true) {
    out.push_back(static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin()));
    if (static_cast<int64_t>(out.size()) == n) return out;
    m.forward_sequence(*st, std::span<const int32_t>(&out.back(), 1), false, &lg);
  }
}

// Wraps the CPU backend; its drafts follow a known continuation, except where `wrong` says so.
// Sequences are told apart by their prompt length (state->prompt_len): `truth` maps it to the
// prompt followed by the reference continuation. The drafter's rows are really computed; only the
// chain and its argmax are replaced.
class ScriptedDrafter : public spec::SpecBackend {
 public:
  using Truth = std::map<int64_t, std::vector<int32_t>>;
  ScriptedDrafter(model::CpuModel& m, Truth truth, std::function<bool(int64_t prompt_len, int64_t pos)> wrong)
      : ScriptedDrafter(spec::make_cpu_spec_backend(m), m.config().vocab_size, std::move(truth), std::move(wrong)) {}
  // Over any backend (the CUDA one in tests/gpu_spec).
  ScriptedDrafter(std::unique_ptr<spec::SpecBackend> inner, int64_t vocab, Truth truth,
                  std::function<bool(int64_t prompt_len, int64_t pos)> wrong)
      : inner_(std::move(inner)), truth_(std::move(truth)), wrong_(std::move(wrong)), vocab_(vocab) {}
  int64_t block_size() const override { return inner_->block_size(); }
  void draft(std::span<spec::DraftItem> items) override {
    inner_->draft(items);
    for (auto& it : items) {
      spec::Draft& d = *it.out;
      const auto seq = truth_.find(it.state->prompt_len);
      for (size_t i = 1; i < d.ids.size(); ++i) {
        const int64_t pos = it.state->n_past + static_cast<int64_t>(i);  // the anchor sits at n_past
        int32_t t = d.ids[i];
        if (seq != truth_.end() && pos < static_cast<int64_t>(seq->second.size())) t = seq->second[static_cast<size_t>(pos)];
        if (wrong_(it.state->prompt_len, pos)) t = (t + 1 + static_cast<int32_t>(pos % 7)) % static_cast<int32_t>(vocab_);
        d.ids[i] = t;
        float* row = d.logits.data() + (i - 1) * static_cast<size_t>(vocab_);
        row[t] = *std::max_element(row, row + vocab_) + 4.0f;
      }
      ++drafts;
    }
  }
  void forward(std::span<ForwardItem> batch, std::span<const uint8_t> verify) override { inner_->forward(batch, verify); }
  void rollback(SeqState& s, int64_t keep) override { inner_->rollback(s, keep); }
  void release(const SeqState& s) override { inner_->release(s); }
  int64_t drafts = 0;

 private:
  std::unique_ptr<spec::SpecBackend> inner_;
  Truth truth_;
  std::function<bool(int64_t, int64_t)> wrong_;
  int64_t vocab_;
};

inline std::vector<int32_t> collect_ids(sched::TokenChannel& ch, std::vector<int64_t>* accepted = nullptr) {
  std::vector<sched::SampledToken> got;
  while (!ch.wait(got, std::chrono::milliseconds(50))) {
  }
  std::vector<int32_t> ids;
  int64_t last = 0;
  for (auto& t : got) {
    ids.push_back(t.id);
    if (accepted) {
      if (t.step != last) accepted->push_back(0);
      last = t.step;
      ++accepted->back();
    }
  }
  return ids;
}

}  // namespace dsv41::test_support
