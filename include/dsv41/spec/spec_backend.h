// What a backend (CPU reference now, CUDA later) provides for speculative decoding with the
// checkpoint's own DSpark drafter (MODEL.md §6). The scheduler drives it; docs/SPECULATIVE.md
// describes the whole step.
//
// One step of a speculating sequence whose last committed token `anchor` is not yet fed:
//   1. draft():   the drafter proposes block positions after the anchor (greedy chain, logits
//                 with the Markov bias, confidence logits) from the sequence's committed state;
//   2. forward(): one target forward over [anchor, d1 .. dk] (all_logits) batched with every other
//                 sequence's decode and prefill items. Every verify position is computed exactly
//                 as a one-token decode step at that position would be, so greedy verification
//                 reproduces non-speculative decoding bit for bit;
//   3. rollback(): keep the first `keep` verify positions (anchor + accepted drafts) and discard
//                 everything the rest wrote (window rings, compressor carries, compressed KV and
//                 index keys, Engram history, DSpark rings and taps).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dsv41/model/model.h"

namespace dsv41::spec {

// The drafter's output for one anchor (MODEL.md §6.3).
struct Draft {
  std::vector<int32_t> ids;         // block+1: the anchor, then the greedy (argmax) chain
  std::vector<float> logits;        // [block][vocab]: base logits + Markov bias of ids[i]
  std::vector<float> confidence;    // [block]: confidence logits of row i (sigmoid: P(accept ids[i+1]))
};

struct DraftItem {
  const SeqState* state = nullptr;  // committed state; the anchor sits at position state->n_past
  int32_t anchor = 0;
  Draft* out = nullptr;
};

class SpecBackend {
 public:
  virtual ~SpecBackend() = default;
  // Drafter positions per call (the config's dspark_block_size): at most this many drafts.
  virtual int64_t block_size() const = 0;
  // Drafts for several sequences (one drafter pass on a device). Does not modify the states.
  virtual void draft(std::span<DraftItem> items) = 0;
  // One target forward. verify[i] != 0 marks batch[i] as a verify item (its tokens are the anchor
  // and the drafts, all_logits set); the others are ordinary prefill chunks or decode steps.
  // Throws like Model::forward; the states of a batch that threw must be discarded.
  virtual void forward(std::span<ForwardItem> batch, std::span<const uint8_t> verify) = 0;
  // After a verify forward of `state`: keeps its first `keep` verify positions (1 .. tokens).
  virtual void rollback(SeqState& state, int64_t keep) = 0;
  // The sequence is gone (finished, preempted, failed): drop whatever the backend holds for it.
  virtual void release(const SeqState& state) = 0;
};

}  // namespace dsv41::spec
