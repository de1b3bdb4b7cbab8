// Speculative decoding on the CUDA model backend (include/dsv41/spec/cuda_backend.h).
//
// Verification runs each verify position as a one-token decode step through CudaModel::forward:
// the engine lays a step out as decode (ring-order window list, its own visible entries, the
// reference's decode-time index-key alias) only for one-token steps, and the alias makes a
// position's indexer depend on a later layer's keys of the previous position, so a single pass
// over several positions could not reproduce it. Before every position after the first, the step
// is saved on the device (CudaModel::save_step: the ring slots, carries and counters it
// overwrites); rollback undoes the saves of the discarded positions in reverse order, which
// returns the state exactly to the kept length without re-running anything — the CPU backend's
// snapshots, restricted to what a step writes. Positions run in rounds: round p holds position p of
// every verify item (round 0 also the ordinary prefill and decode items) in one CudaModel::forward
// call, so an engine that batches one-token steps across sequences verifies them together.
#include "dsv41/spec/cuda_backend.h"

#include <algorithm>
#include <chrono>

#include "dsv41/common/error.h"

namespace dsv41::spec {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CudaSpecBackend::CudaSpecBackend(model::CudaModel& model) : m_(model) {
  DSV_CHECK(m_.has_dspark(), "speculative decoding needs the DSpark (mtp.*) stages; the model was loaded without them");
  DSV_CHECK(m_.config().dspark_block_size >= 1, "config: dspark_block_size must be at least 1");
}

int64_t CudaSpecBackend::block_size() const { return m_.config().dspark_block_size; }

void CudaSpecBackend::draft(std::span<DraftItem> items) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<const SeqState*> states;
  std::vector<int32_t> anchors;
  for (const DraftItem& it : items) {
    DSV_CHECK(it.state != nullptr && it.out != nullptr, "draft: item without a state or an output");
    states.push_back(it.state);
    anchors.push_back(it.anchor);
  }
  if (!states.empty()) {
    std::vector<model::DsparkDraft> d = m_.dspark_draft_batch(states, anchors);
    for (size_t i = 0; i < items.size(); ++i) {
      items[i].out->ids = std::move(d[i].ids);
      items[i].out->logits = std::move(d[i].logits);
      items[i].out->confidence = std::move(d[i].confidence);
    }
  }
  last_draft_s_ = seconds_since(t0);
}

void CudaSpecBackend::forward(std::span<ForwardItem> batch, std::span<const uint8_t> verify) {
  const auto t0 = std::chrono::steady_clock::now();
  DSV_CHECK(verify.size() == batch.size(), "forward: {} verify flags for {} items", verify.size(), batch.size());
  // A rollback that never came (a failed step) must not leak into this step.
  for (auto& [state, s] : saved_) {
    s.used = 0;
    s.verified = false;
  }
  const size_t V = static_cast<size_t>(m_.config().vocab_size);
  size_t positions = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!verify[i]) continue;
    ForwardItem& it = batch[i];
    DSV_CHECK(it.state != nullptr && it.logits != nullptr && it.all_logits && !it.tokens.empty(),
              "forward: a verify item needs a state, tokens and all_logits");
    const SeqState& st = *it.state;
    DSV_CHECK(st.n_past > 0 && st.n_past >= st.prompt_len,
              "forward: a verify item must follow the prompt (n_past {}, prompt_len {})", st.n_past, st.prompt_len);
    saved_[&st].verified = true;
    it.logits->assign(it.tokens.size() * V, 0.0f);
    positions = std::max(positions, it.tokens.size());
  }
  // Round p: the ordinary items (p = 0) and position p of every verify item still that long, each a
  // one-token step of its own sequence, in one model call.
  std::vector<ForwardItem> round;
  std::vector<size_t> owner;
  std::vector<std::vector<float>> rows(batch.size());
  for (size_t p = 0; p == 0 || p < positions; ++p) {
    round.clear();
    owner.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
      ForwardItem& it = batch[i];
      if (!verify[i]) {
        if (p == 0) round.push_back(it);
        continue;
      }
      if (p >= it.tokens.size()) continue;
      if (p > 0) {  // the state before position p
        Saved& s = saved_[it.state];
        if (s.steps.size() < p) s.steps.resize(p);
        m_.save_step(*it.state, s.steps[p - 1]);
        s.used = static_cast<int64_t>(p);
      }
      round.push_back(ForwardItem{it.state, it.tokens.subspan(p, 1), false, &rows[i]});
      owner.push_back(i);
    }
    if (round.empty()) continue;
    m_.forward(round);
    for (size_t i : owner)
      std::copy(rows[i].begin(), rows[i].end(), batch[i].logits->begin() + static_cast<std::ptrdiff_t>(p * V));
  }
  last_forward_s_ = seconds_since(t0);
}

void CudaSpecBackend::rollback(SeqState& state, int64_t keep) {
  auto it = saved_.find(&state);
  DSV_CHECK(it != saved_.end() && it->second.verified, "rollback: the sequence had no verify forward in this step");
  Saved& s = it->second;
  const int64_t positions = s.used + 1;
  DSV_CHECK(keep >= 1 && keep <= positions, "rollback: keep {} outside 1..{}", keep, positions);
  for (int64_t i = s.used - 1; i >= keep - 1; --i) m_.undo_step(state, s.steps[static_cast<size_t>(i)]);
  s.used = 0;
  s.verified = false;
}

void CudaSpecBackend::release(const SeqState& state) { saved_.erase(&state); }

std::unique_ptr<CudaSpecBackend> make_cuda_spec_backend(model::CudaModel& model) {
  return std::make_unique<CudaSpecBackend>(model);
}

}  // namespace dsv41::spec
