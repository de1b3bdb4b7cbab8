#include "model/ops/rope.h"

#include <algorithm>
#include <cmath>

#include "dsv41/common/numeric.h"

namespace dsv41::model {

RopeTable::RopeTable(int64_t rope_dim, double theta, int64_t yarn_original, double factor, double beta_fast,
                     double beta_slow)
    : rope_dim_(rope_dim) {
  const int64_t half = rope_dim / 2;
  freqs_.resize(static_cast<size_t>(half));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    freqs_[i] = 1.0f / std::pow(base, e);
  }
  if (yarn_original > 0) {
    // The correction band is computed in double precision (Python math) and floored/ceiled.
    auto corrected_dim = [&](double rotations) {
      return static_cast<double>(rope_dim) * std::log(static_cast<double>(yarn_original) / (rotations * 2 * M_PI)) /
             (2 * std::log(theta));
    };
    const double low = std::max(std::floor(corrected_dim(beta_fast)), 0.0);
    const double high = std::min(std::ceil(corrected_dim(beta_slow)), static_cast<double>(rope_dim - 1));
    const float denom = static_cast<float>(std::max(high - low, 1e-3));
    const float ffactor = static_cast<float>(factor);
    for (int64_t i = 0; i < half; ++i) {
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / denom, 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      freqs_[i] = freqs_[i] / ffactor * (1.0f - smooth) + freqs_[i] * smooth;
    }
  }
}

RopeTable RopeTable::for_ratio(const ModelConfig& c, int64_t ratio) {
  if (ratio == 0) return RopeTable(c.qk_rope_head_dim, c.rope_theta, 0, 1.0, 32, 1);
  const bool yarn = c.rope_scaling.type == "yarn";
  return RopeTable(c.qk_rope_head_dim, c.compress_rope_theta, yarn ? c.rope_scaling.original_max_position_embeddings : 0,
                   c.rope_scaling.factor, c.rope_scaling.beta_fast, c.rope_scaling.beta_slow);
}

void RopeTable::apply(float* v, int64_t p, bool inverse) const {
  const float pf = static_cast<float>(p);
  for (size_t i = 0; i < freqs_.size(); ++i) {
    const float angle = pf * freqs_[i];
    // cos/sin of the fp32 angle, correctly rounded to fp32 (torch.polar in fp32).
    const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    float s = static_cast<float>(std::sin(static_cast<double>(angle)));
    if (inverse) s = -s;
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = bf16_round(a * c - b * s);
    v[2 * i + 1] = bf16_round(a * s + b * c);
  }
}

}  // namespace dsv41::model
