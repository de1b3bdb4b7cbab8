#include "model/ops/torch_sum.h"
#include "model/ops/mhc.h"
#include "model/ops/dot.h"
#include "dsv41/model/mix_gemm_parts.h"
#include "model/ops/vec_math.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"

namespace dsv41::model {
HcMixArithmetic hc_mix_arithmetic(int64_t hc, int64_t t_ref, int64_t rows_ref, int64_t k_parts) {
  HcMixArithmetic a;
  a.k_parts = k_parts;
  a.sigmoid_vector = std::clamp<int64_t>(torch_vector_body_elements(rows_ref * hc) - t_ref * hc, 0, hc);
  return a;
}

float hc_gemm_dot(const float* a, const float* b, int64_t n, int64_t k_parts) {
  if (k_parts == kMixGemmChunks) return gemm_dot_f32(a, b, n);
  DSV_CHECK(k_parts == kMixGemmBlocked || k_parts > 0, "mixes GEMM: unresolved K order {}", k_parts);
  float total = 0.0f;
  const int64_t parts = mix_gemm_part_count(n, k_parts);
  for (int64_t p = 0; p < parts; ++p) {
    int64_t k0 = 0, k1 = 0;
    mix_gemm_part_range(n, k_parts, p, k0, k1);
    if (k0 >= n) break;  // P parts: the reference stops once K is covered
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; ++k) acc = std::fma(a[k], b[k], acc);
    total = p == 0 ? acc : total + acc;
  }
  return total;
}

void hc_split_sinkhorn(const float* m, int64_t hc, const float* base, const float* scale, int64_t iters,
                       double hc_eps, HcMix& out) {
  hc_split_sinkhorn(m, hc, base, scale, iters, hc_eps, HcMixArithmetic{hc, 0}, out);
}

void hc_split_sinkhorn(const float* m, int64_t hc, const float* base, const float* scale, int64_t iters,
                       double hc_eps, const HcMixArithmetic& arith, HcMix& out) {
  DSV_ASSERT(hc <= 16, "hc_mult {} too large", hc);
  const float eps = static_cast<float>(hc_eps);
  // torch.sigmoid (vector body or scalar tail per element); the Sinkhorn softmax's torch.exp agrees
  // with std::exp.
  for (int64_t i = 0; i < hc; ++i) {
    const bool vec = i < arith.sigmoid_vector;
    out.pre[i] = torch_sigmoid_f32(m[i] * scale[0] + base[i], vec) + eps;
    out.post[i] = 2.0f * torch_sigmoid_f32(m[hc + i] * scale[1] + base[hc + i], vec);
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
  hc_mix(h, hc, dim, fn, base, scale, iters, hc_eps, norm_eps, HcMixArithmetic{hc, 0}, out);
}

void hc_mix(const float* h, int64_t hc, int64_t dim, const float* fn, const float* base, const float* scale,
            int64_t iters, double hc_eps, double norm_eps, const HcMixArithmetic& arith, HcMix& out) {
  const int64_t k = hc * dim, n_mix = (2 + hc) * hc;
  const float r = 1.0f / std::sqrt(torch_mean_sq_f32(h, k) + static_cast<float>(norm_eps));
  std::vector<float> m(static_cast<size_t>(n_mix));
  for (int64_t i = 0; i < n_mix; ++i) {
    const float* w = fn + i * k;
    m[static_cast<size_t>(i)] = hc_gemm_dot(w, h, k, arith.k_parts) * r;
  }
  hc_split_sinkhorn(m.data(), hc, base, scale, iters, hc_eps, arith, out);
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
