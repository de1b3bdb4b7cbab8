#include "model/ops/topk.h"

#include <algorithm>
#include <cmath>
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

}  // namespace dsv41::model
