#include "spec/draft_policy.h"

#include <algorithm>
#include <cmath>

namespace dsv41::spec {
namespace {

constexpr double kDecay = 0.1;          // weight of the newest verified draft in the running means
constexpr double kPauseBelow = 0.2;     // running acceptance under which a full rejection pauses
constexpr int64_t kMaxPause = 16;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

double DraftPolicy::calibration() const {
  // The confidence head was trained on other text than this conversation may be: scale its
  // probabilities by how this sequence's drafts actually fare (bounded so one bad run cannot
  // switch the head off for good).
  return std::clamp((observed_ + 0.05) / (predicted_ + 0.05), 0.25, 4.0);
}

int64_t DraftPolicy::choose(std::span<const float> confidence, int64_t cap) const {
  cap = std::min<int64_t>(cap, static_cast<int64_t>(confidence.size()));
  if (cap <= 0) return 0;
  const double cal = calibration();
  double chain = 1.0;
  int64_t k = 0;
  for (int64_t i = 0; i < cap; ++i) {
    chain *= std::clamp(sigmoid(confidence[static_cast<size_t>(i)]) * cal, 0.0, 1.0);
    if (k >= 1 && chain < min_chain_prob_) break;
    ++k;
  }
  return k;
}

void DraftPolicy::observe(std::span<const float> confidence, int64_t k, int64_t accepted) {
  // Drafts after the first rejection were never tested: only the first min(accepted + 1, k) count.
  const int64_t tested = std::min(accepted + 1, k);
  for (int64_t i = 0; i < tested; ++i) {
    const double x = i < accepted ? 1.0 : 0.0;
    const double pred = i < static_cast<int64_t>(confidence.size()) ? sigmoid(confidence[static_cast<size_t>(i)]) : 0.5;
    observed_ += kDecay * (x - observed_);
    predicted_ += kDecay * (pred - predicted_);
  }
  if (accepted > 0) {
    pause_len_ = 0;
  } else if (observed_ < kPauseBelow) {
    pause_len_ = std::min(kMaxPause, std::max<int64_t>(1, 2 * pause_len_));
    pause_left_ = pause_len_;
  }
}

}  // namespace dsv41::spec
