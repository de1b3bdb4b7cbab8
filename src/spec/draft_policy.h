// Per-sequence adaptive draft length (docs/SPECULATIVE.md §3). Everything it decides depends on
// the sequence's own history only, so a seeded request stays reproducible under any batching.
#pragma once
#include <cstdint>
#include <span>

namespace dsv41::spec {

class DraftPolicy {
 public:
  explicit DraftPolicy(double min_chain_prob) : min_chain_prob_(min_chain_prob) {}

  // Drafts to verify (1 .. cap) given the drafter's confidence logits (row i: draft i+1): the
  // longest prefix whose estimated all-accepted probability stays >= min_chain_prob, at least one.
  // The head's probabilities are rescaled by this sequence's observed / predicted acceptance.
  int64_t choose(std::span<const float> confidence, int64_t cap) const;
  // After verification of k drafts of which `accepted` were accepted.
  void observe(std::span<const float> confidence, int64_t k, int64_t accepted);
  // Paused after repeated complete rejections with a low running acceptance: the sequence decodes
  // without drafting for a while (1, 2, 4 .. 16 steps), then probes again.
  bool paused() const { return pause_left_ > 0; }
  void skipped_step() {
    if (pause_left_ > 0) --pause_left_;
  }
  double observed_acceptance() const { return observed_; }

 private:
  double calibration() const;
  double min_chain_prob_;
  double observed_ = 0.5, predicted_ = 0.5;  // running means over verified drafts
  int64_t pause_left_ = 0, pause_len_ = 0;
};

}  // namespace dsv41::spec
