// Speculative decoding on the CPU reference engine. Verification runs each position as a
// one-token decode step (the engine's decode layout and the reference's decode-time index-key
// alias only apply to one-token steps), which is what makes greedy verification bit-identical to
// non-speculative decoding. Rollback restores a snapshot (CpuModel::restore_state) taken before
// the first discarded position: every piece of sequence state lives in the state object, so the
// restore is exact without re-running anything.
#include "dsv41/spec/cpu_backend.h"

#include <algorithm>
#include <unordered_map>

#include "dsv41/common/error.h"
#include "dsv41/dist/tp_runtime.h"

namespace dsv41::spec {
namespace {

// M: model::CpuModel, or dist::TpModel (rank 0 of a tensor-parallel run: same API, every call a
// collective step the workers mirror).
template <class M>
class CpuSpecBackend final : public SpecBackend {
 public:
  explicit CpuSpecBackend(M& m) : m_(m) {
    DSV_CHECK(m_.has_dspark(), "speculative decoding needs the DSpark (mtp.*) stages; the model was loaded without them");
    DSV_CHECK(m_.config().dspark_block_size >= 1, "config: dspark_block_size must be at least 1");
  }

  int64_t block_size() const override { return m_.config().dspark_block_size; }

  void draft(std::span<DraftItem> items) override {
    for (DraftItem& it : items) {
      DSV_CHECK(it.state != nullptr && it.out != nullptr, "draft: item without a state or an output");
      model::DsparkDraft d = m_.dspark_draft(*it.state, it.anchor);
      it.out->ids = std::move(d.ids);
      it.out->logits = std::move(d.logits);
      it.out->confidence = std::move(d.confidence);
    }
  }

  void forward(std::span<ForwardItem> batch, std::span<const uint8_t> verify) override {
    DSV_CHECK(verify.size() == batch.size(), "forward: {} verify flags for {} items", verify.size(), batch.size());
    snapshots_.clear();  // a rollback that never came (a failed step) must not leak into this one
    std::vector<ForwardItem> plain;
    for (size_t i = 0; i < batch.size(); ++i)
      if (!verify[i]) plain.push_back(batch[i]);
    if (!plain.empty()) m_.forward(plain);
    const size_t V = static_cast<size_t>(m_.config().vocab_size);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!verify[i]) continue;
      ForwardItem& it = batch[i];
      DSV_CHECK(it.state != nullptr && it.logits != nullptr && it.all_logits && !it.tokens.empty(),
                "forward: a verify item needs a state, tokens and all_logits");
      SeqState& st = *it.state;
      DSV_CHECK(st.n_past > 0 && st.n_past >= st.prompt_len,
                "forward: a verify item must follow the prompt (n_past {}, prompt_len {})", st.n_past, st.prompt_len);
      auto& snaps = snapshots_[&st];
      it.logits->assign(it.tokens.size() * V, 0.0f);
      std::vector<float> row;
      for (size_t p = 0; p < it.tokens.size(); ++p) {
        if (p > 0) {  // the state holding the first p positions
          // On the heap, not in the server's state pool: snapshots live for one step only.
          snaps.push_back(m_.new_sequence());
          m_.restore_state(*snaps.back(), st);
        }
        m_.forward_sequence(st, it.tokens.subspan(p, 1), false, &row);
        std::copy(row.begin(), row.end(), it.logits->begin() + static_cast<std::ptrdiff_t>(p * V));
      }
    }
  }

  void rollback(SeqState& state, int64_t keep) override {
    auto it = snapshots_.find(&state);
    DSV_CHECK(it != snapshots_.end(), "rollback: the sequence had no verify forward in this step");
    const int64_t positions = static_cast<int64_t>(it->second.size()) + 1;
    DSV_CHECK(keep >= 1 && keep <= positions, "rollback: keep {} outside 1..{}", keep, positions);
    if (keep < positions) m_.restore_state(state, *it->second[static_cast<size_t>(keep - 1)]);
    snapshots_.erase(it);
  }

  void release(const SeqState& state) override { snapshots_.erase(&state); }

 private:
  M& m_;
  std::unordered_map<const SeqState*, std::vector<std::unique_ptr<SeqState>>> snapshots_;
};

}  // namespace

std::unique_ptr<SpecBackend> make_cpu_spec_backend(model::CpuModel& model) {
  return std::make_unique<CpuSpecBackend<model::CpuModel>>(model);
}

std::unique_ptr<SpecBackend> make_cpu_spec_backend(dist::TpModel& model) {
  return std::make_unique<CpuSpecBackend<dist::TpModel>>(model);
}

}  // namespace dsv41::spec
