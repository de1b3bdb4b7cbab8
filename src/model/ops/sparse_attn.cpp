#include "model/ops/dot.h"
#include "model/ops/sparse_attn.h"
#include "model/ops/torch_sum.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsv41/common/numeric.h"

namespace dsv41::model {

void sparse_attention(const float* q, const std::vector<const float*>& rows, const float* sink, float scale,
                      int64_t heads, int64_t d, float* out) {
  constexpr int64_t kBlock = 64;
  const int64_t n = static_cast<int64_t>(rows.size());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> acc(static_cast<size_t>(d)), pv(static_cast<size_t>(d)), s(kBlock), p(kBlock);
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * d;
    float m = -1e30f, l = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t c0 = 0; c0 < n; c0 += kBlock) {
      const int64_t cn = std::min(kBlock, n - c0);
      float mx = neg_inf;
      for (int64_t j = 0; j < cn; ++j) {
        const float* r = rows[static_cast<size_t>(c0 + j)];
        if (!r) {
          s[j] = neg_inf;
          continue;
        }
        s[j] = gemm_dot_f32(qh, r, d) * scale;
        mx = std::max(mx, s[j]);
      }
      const float m_new = std::max(m, mx);
      const float c = std::exp(m - m_new);
      for (int64_t j = 0; j < cn; ++j) p[j] = std::exp(s[j] - m_new);
      const float psum = torch_sum_f32(p.data(), cn);
      l = l * c + psum;
      // PV of this chunk summed from zero, then acc·c + pv (two separate roundings, as the reference).
      std::fill(pv.begin(), pv.end(), 0.0f);
      for (int64_t j = 0; j < cn; ++j) {
        const float* r = rows[static_cast<size_t>(c0 + j)];
        if (!r) continue;
        const float pb = bf16_round(p[j]);
        for (int64_t k = 0; k < d; ++k) pv[k] += pb * r[k];
      }
      for (int64_t k = 0; k < d; ++k) acc[k] = acc[k] * c + pv[k];
      m = m_new;
    }
    l = l + std::exp(sink[h] - m);
    for (int64_t k = 0; k < d; ++k) out[h * d + k] = bf16_round(acc[k] / l);
  }
}

}  // namespace dsv41::model
