#include "model/ops/torch_sum.h"
#include "model/ops/mhc.h"
#include "model/ops/dot.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"

namespace dsv41::model {
namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void hc_split_sinkhorn(const float* m, int64_t hc, const float* base, const float* scale, int64_t iters,
                       double hc_eps, HcMix& out) {
  DSV_ASSERT(hc <= 16, "hc_mult {} too large", hc);
  const float eps = static_cast<float>(hc_eps);
  for (int64_t i = 0; i < hc; ++i) {
    out.pre[i] = sigmoid(m[i] * scale[0] + base[i]) + eps;
    out.post[i] = 2.0f * sigmoid(m[hc + i] * scale[1] + base[hc + i]);
  }
  float* c = out.comb;
  for (int64_t i = 0; i < hc * hc; ++i) c[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
  auto row_norm = [&](bool softmax) {
    for (int64_t r = 0; r < hc; ++r) {
      float* row = c + r * hc;
      if (softmax) {
        float mx = row[0];
        for (int64_t k = 1; k < hc; ++k) mx = std::max(mx, row[k]);
        for (int64_t k = 0; k < hc; ++k) row[k] = std::exp(row[k] - mx);
      }
      float s = 0.0f;
      for (int64_t k = 0; k < hc; ++k) s += row[k];
      for (int64_t k = 0; k < hc; ++k) row[k] = softmax ? row[k] / s + eps : row[k] / (s + eps);
    }
  };
  auto col_norm = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int64_t r = 0; r < hc; ++r) s += c[r * hc + k];
      for (int64_t r = 0; r < hc; ++r) c[r * hc + k] = c[r * hc + k] / (s + eps);
    }
  };
  row_norm(true);
  col_norm();
  for (int64_t it = 0; it + 1 < iters; ++it) {
    row_norm(false);
    col_norm();
  }
}

void hc_mix(const float* h, int64_t hc, int64_t dim, const float* fn, const float* base, const float* scale,
            int64_t iters, double hc_eps, double norm_eps, HcMix& out) {
  const int64_t k = hc * dim, n_mix = (2 + hc) * hc;
  const float r = 1.0f / std::sqrt(torch_mean_sq_f32(h, k) + static_cast<float>(norm_eps));
  std::vector<float> m(static_cast<size_t>(n_mix));
  for (int64_t i = 0; i < n_mix; ++i) {
    const float* w = fn + i * k;
    m[static_cast<size_t>(i)] = gemm_dot_f32(w, h, k) * r;
  }
  hc_split_sinkhorn(m.data(), hc, base, scale, iters, hc_eps, out);
}

void hc_collapse(const float* h, const float* w, int64_t hc, int64_t dim, float* out) {
  for (int64_t d = 0; d < dim; ++d) {
    float s = 0.0f;
    for (int64_t j = 0; j < hc; ++j) s += w[j] * h[j * dim + d];
    out[d] = bf16_round(s);
  }
}

void hc_expand(const float* y, float* h, const HcMix& mix, int64_t hc, int64_t dim) {
  std::vector<float> res(h, h + hc * dim);
  for (int64_t k = 0; k < hc; ++k) {
    for (int64_t d = 0; d < dim; ++d) {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s += mix.comb[j * hc + k] * res[j * dim + d];
      h[k * dim + d] = bf16_round(mix.post[k] * y[d] + s);
    }
  }
}

}  // namespace dsv41::model
