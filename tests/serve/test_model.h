// Test double of the Model interface for scheduler/API tests (never used by the product): a
// deterministic next-token rule over the sequence history, so that any mix-up of sequence states
// by the scheduler (batching, chunking, preemption) changes the output. Optionally follows
// scripts: after the last `anchor` token (the chat renderer's Assistant marker + the think marker
// after it), it emits a scripted id list chosen by a key found in the prompt bytes, then EOS.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <memory_resource>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/model/model.h"
#include "sched/state_budget.h"

namespace dsv41::test_support {

class RuleModel : public Model {
 public:
  struct State : SeqState {
    explicit State(RuleModel* m, std::pmr::memory_resource* memory = std::pmr::new_delete_resource())
        : model(m), packed(memory) {
      ++model->live_;
    }
    ~State() override { --model->live_; }
    RuleModel* model;
    std::vector<int32_t> history;
    // Pooled states hold the bytes a packed-layout backend would (MODEL.md §5.7), from the pool.
    std::pmr::vector<std::byte> packed;
    int64_t room = -1;
  };

  explicit RuleModel(ModelConfig cfg) : cfg_(std::move(cfg)) {}

  const ModelConfig& config() const override { return cfg_; }
  std::unique_ptr<SeqState> new_sequence() const override {
    return std::make_unique<State>(const_cast<RuleModel*>(this));
  }
  std::unique_ptr<SeqState> new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const override {
    auto s = std::make_unique<State>(const_cast<RuleModel*>(this), &memory);
    reserve_sequence(*s, capacity_tokens);
    return s;
  }
  void reserve_sequence(SeqState& state, int64_t capacity_tokens) const override {
    auto& s = static_cast<State&>(state);
    if (capacity_tokens <= s.room) return;
    s.packed.reserve(static_cast<size_t>(state_bytes(capacity_tokens)));
    s.room = capacity_tokens;
  }
  int64_t state_bytes(int64_t capacity_tokens) const override {
    const auto b = sched::state_bytes(cfg_);
    return b.packed_fixed + b.packed_per_token * capacity_tokens;
  }

  void forward(std::span<ForwardItem> batch) override {
    if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms.load()));
    int64_t tokens = 0;
    for (auto& it : batch) {
      auto* s = static_cast<State*>(it.state);
      DSV_CHECK(s->n_past == static_cast<int64_t>(s->history.size()), "n_past {} != history {}", s->n_past, s->history.size());
      DSV_CHECK(s->room < 0 || s->n_past + static_cast<int64_t>(it.tokens.size()) <= s->room,
                "{} tokens at {} exceed the room of {}", it.tokens.size(), s->n_past, s->room);
      for (int32_t t : it.tokens) {
        DSV_CHECK(t >= 0 && t < cfg_.vocab_size, "token {} out of range", t);
        s->history.push_back(t);
      }
      s->n_past = static_cast<int64_t>(s->history.size());
      DSV_CHECK(s->n_past <= cfg_.max_position_embeddings, "context exceeded");
      tokens += static_cast<int64_t>(it.tokens.size());
      const size_t V = static_cast<size_t>(cfg_.vocab_size);
      it.logits->assign(V, 0.0f);
      logits_row(s->history, it.logits->data());
      if (picks_greedy && it.greedy_id) {  // pick like a GPU would, and poison the row the caller must not read
        *it.greedy_id = static_cast<int32_t>(std::max_element(it.logits->begin(), it.logits->end()) - it.logits->begin());
        it.logits->assign(V, std::numeric_limits<float>::quiet_NaN());
        ++greedy_picks;
      }
    }
    std::lock_guard lk(mu_);
    max_batch_ = std::max<int64_t>(max_batch_, static_cast<int64_t>(batch.size()));
    max_step_tokens_ = std::max(max_step_tokens_, tokens);
    ++steps_;
  }

  // The next-token rule. The favourite gets +8; the rest get a spread so that sampling has
  // something to choose from.
  int32_t favourite(const std::vector<int32_t>& h) const {
    if (anchor >= 0) {
      auto it = std::find(h.rbegin(), h.rend(), anchor);
      if (it != h.rend()) {
        const size_t pos = static_cast<size_t>(h.rend() - it) - 1;  // index of the anchor
        const std::string prompt = bytes_of(h, pos);
        for (auto& [key, ids] : scripts) {
          if (prompt.find(key) == std::string::npos) continue;
          const size_t k = h.size() - pos - 2;  // anchor, then the think marker
          if (h.size() < pos + 2) break;
          return k < ids.size() ? ids[k] : static_cast<int32_t>(cfg_.eos_token_id);
        }
      }
    }
    uint64_t x = 1469598103934665603ull ^ h.size();
    for (size_t i = h.size() >= 3 ? h.size() - 3 : 0; i < h.size(); ++i) x = (x ^ static_cast<uint64_t>(h[i])) * 1099511628211ull;
    const int32_t lo = 3, span = static_cast<int32_t>(cfg_.vocab_size) - 3;
    return lo + static_cast<int32_t>(x % static_cast<uint64_t>(span));
  }

  void logits_row(const std::vector<int32_t>& h, float* row) const {
    const int32_t V = static_cast<int32_t>(cfg_.vocab_size);
    for (int32_t i = 0; i < V; ++i) row[i] = static_cast<float>((i * 7919 + static_cast<int32_t>(h.size()) * 31) % 97) / 32.0f;
    row[cfg_.eos_token_id] = -4.0f;  // EOS only when scripted
    row[favourite(h)] = 8.0f;
  }

  int64_t live() const { return live_.load(); }
  int64_t max_batch() const { std::lock_guard lk(mu_); return max_batch_; }
  int64_t max_step_tokens() const { std::lock_guard lk(mu_); return max_step_tokens_; }
  int64_t steps() const { std::lock_guard lk(mu_); return steps_; }

  // Script support (set before use).
  int32_t anchor = -1;
  std::vector<std::pair<std::string, std::vector<int32_t>>> scripts;
  std::function<std::string(int32_t)> token_bytes;  // for matching script keys against the prompt
  std::atomic<int> step_delay_ms{0};  // tests change it while the engine runs
  // Honour ForwardItem::greedy_id (as the CUDA backend does) and count the picks made.
  bool picks_greedy = false;
  std::atomic<int64_t> greedy_picks{0};

 private:
  std::string bytes_of(const std::vector<int32_t>& h, size_t n) const {
    std::string s;
    if (!token_bytes) return s;
    for (size_t i = 0; i < n; ++i) s += token_bytes(h[i]);
    return s;
  }

  ModelConfig cfg_;
  std::atomic<int64_t> live_{0};
  mutable std::mutex mu_;
  int64_t max_batch_ = 0, max_step_tokens_ = 0, steps_ = 0;
};

// The tiny fixture's config (sizes for the state arithmetic; vocab 512).
inline ModelConfig tiny_config() { return load_model_config(std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model/config.json"); }

}  // namespace dsv41::test_support
