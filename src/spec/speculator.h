// One sequence's side of a speculative step (docs/SPECULATIVE.md): turns the drafter's output
// into the drafts to verify (with the drafter's distributions under the request's sampling
// transforms), then verifies the target's rows — greedy by argmax, sampled by rejection sampling
// — and commits the tokens through the sequence's Sampler.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dsv41/spec/options.h"
#include "dsv41/spec/spec_backend.h"
#include "sched/sampling.h"
#include "spec/draft_policy.h"

namespace dsv41::spec {

// Ids banned for the generated token with index i (0 = the first generated token): `ids` while
// i < min_tokens (EOS and stop ids below min_tokens).
struct BanRule {
  int64_t min_tokens = 0;
  std::vector<int32_t> ids;
  std::span<const int32_t> at(int64_t index) const {
    return index < min_tokens ? std::span<const int32_t>(ids) : std::span<const int32_t>();
  }
};

struct VerifyOutcome {
  std::vector<sched::SampledToken> tokens;  // committed: accepted drafts, then the replacement or bonus
  int64_t accepted = 0;                     // drafts accepted
};

class SeqSpeculator {
 public:
  SeqSpeculator(const SpecOptions& o, int64_t block_size);

  // False while the adaptive policy pauses this sequence.
  bool wants_draft() const;
  // The sequence decodes this step without drafts (paused, batch too wide, no room).
  void skip_step() { policy_.skipped_step(); }
  // Most drafts this sequence may verify in one step (options and block size).
  int64_t max_drafts() const { return max_drafts_; }

  // Chooses up to `cap` drafts from `d` (anchor = d.ids[0]); 0 when cap < 1. `n_generated`: the
  // sequence's generated tokens so far (the first draft is generated token n_generated).
  // Sampled requests draw their drafts from the drafter's distribution with `s`'s RNG.
  int64_t propose(const Draft& d, int64_t cap, sched::Sampler& s, const BanRule& bans, int64_t n_generated);
  // Keeps only the first k proposed drafts (the step had no room for more).
  void truncate(int64_t k);
  int64_t k() const { return static_cast<int64_t>(tokens_.size()) - 1; }
  // [anchor, d1 .. dk]: the verify item's tokens.
  std::span<const int32_t> verify_tokens() const { return tokens_; }

  // `rows`: the target's k+1 logits rows of the verify forward.
  VerifyOutcome verify(std::span<const float> rows, int64_t vocab, sched::Sampler& s, const BanRule& bans,
                       int64_t n_generated);

 private:
  SpecOptions opt_;
  int64_t max_drafts_;
  DraftPolicy policy_;
  std::vector<int32_t> tokens_;                 // anchor + drafts of the current step
  std::vector<sched::TokenDistribution> q_;     // drafter distribution of each draft
  std::vector<float> confidence_;               // confidence logits of the current draft rows
};

}  // namespace dsv41::spec
