#include "model/ops/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace dsv41::model {

std::vector<int32_t> torch_topk_indices(const std::vector<float>& values, int64_t k) {
  using Elem = std::pair<float, int64_t>;
  const int64_t n = static_cast<int64_t>(values.size());
  k = std::min(k, n);
  std::vector<int32_t> out;
  if (k <= 0) return out;
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[j] = {values[j], j};
  auto greater = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
  };
  if (k * 64 <= n) std::partial_sort(q.begin(), q.begin() + k, q.end(), greater);
  else std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), greater);
  out.reserve(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) out.push_back(static_cast<int32_t>(q[j].second));
  return out;
}

std::vector<int32_t> topk_sorted(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> idx = torch_topk_indices(s, k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<uint8_t> candidate_mask(const std::vector<float>& scores, int64_t n_vis, int64_t topk_blocks,
                                    int64_t block_size) {
  const int64_t width = static_cast<int64_t>(scores.size());
  const int64_t nb = (width + block_size - 1) / block_size;
  std::vector<float> bs(static_cast<size_t>(nb), -std::numeric_limits<float>::infinity());
  for (int64_t u = 0; u < width; ++u) bs[u / block_size] = std::max(bs[u / block_size], scores[u]);
  // floor division: a query with nothing visible pins no block
  const int64_t last = n_vis > 0 ? (n_vis - 1) / block_size : -1;
  if (last >= 0 && last < nb) bs[last] = std::numeric_limits<float>::infinity();
  const std::vector<int32_t> top = topk_sorted(bs, std::min(topk_blocks, nb));
  std::vector<uint8_t> keep_block(static_cast<size_t>(nb), 0);
  for (int32_t b : top)
    if (bs[b] > -std::numeric_limits<float>::infinity()) keep_block[b] = 1;
  std::vector<uint8_t> mask(static_cast<size_t>(width));
  for (int64_t u = 0; u < width; ++u) mask[u] = keep_block[u / block_size];
  return mask;
}

}  // namespace dsv41::model
