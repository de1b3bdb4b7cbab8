#include "model/ops/topk.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace dsv41::model {
namespace {

// The reference ranks (value, index) pairs by value only: a ranks above b when a is NaN and b is
// not, or a > b. order_key maps a float to an int whose order is exactly that relation (NaN on top,
// -0 and +0 equal, every other value by magnitude and sign), so the heap below compares ints.
inline int32_t order_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return INT32_MAX;
  if (mag == 0) return 0;
  return (u >> 31) ? -static_cast<int32_t>(mag) : static_cast<int32_t>(mag);
}
// The value of a key (the float it came from, up to the sign of zero and the NaN payload).
inline float key_value(int32_t key) {
  if (key == INT32_MAX) return std::numeric_limits<float>::quiet_NaN();
  const uint32_t u = key < 0 ? (static_cast<uint32_t>(-key) | 0x80000000u) : static_cast<uint32_t>(key);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Ranked {
  int32_t key;
  int32_t index;
};
// The heap's comparator, as std::partial_sort receives it: "a ranks above b".
inline bool above(const Ranked& a, const Ranked& b) { return a.key > b.key; }

// A new entry replaces the heap's top (the lowest-ranked of the k kept): the standard library's
// pop-heap step with a value, i.e. the hole at the root is walked down to a leaf along the
// higher-ranked children (the right one unless the left ranks above it, a lone last child taken at
// the end) and the new entry then climbs back up while its parent ranks below it. This exact walk
// (not a sift-down that stops early) decides where exactly tied entries sit, hence which of them a
// later replacement evicts: the reference's tie order.
void replace_top(Ranked* h, int64_t len, Ranked v) {
  int64_t hole = 0, child = 0;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    child -= above(h[child], h[child - 1]);
    h[hole] = h[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    h[hole] = h[child - 1];
    hole = child - 1;
  }
  int64_t parent = (hole - 1) / 2;
  while (hole > 0 && above(h[parent], v)) {
    h[hole] = h[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  h[hole] = v;
}

// std::partial_sort's selection phase over (values[j], j): a heap of the first k entries, then
// every later entry that ranks above the heap's top replaces it, in index order. Returns the heap
// (the k selected entries in the standard library's heap layout). Most entries are rejected by a
// four-lane compare against the top's value over runs of 64 (vector extensions of GCC and Clang:
// SSE on x86-64, NEON on ARM64); a run holding a candidate is walked one entry at a time.
std::vector<Ranked> heap_select(const float* x, int64_t n, int64_t k) {
  std::vector<Ranked> h(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) h[static_cast<size_t>(j)] = {order_key(x[j]), static_cast<int32_t>(j)};
  std::make_heap(h.begin(), h.end(), above);
  typedef float f32x4 __attribute__((vector_size(16)));
  typedef int32_t i32x4 __attribute__((vector_size(16)));
  constexpr int64_t kRun = 64;
  // An entry can enter only if it is not below the top's value (a NaN top: nothing is below it, and
  // the key test then rejects everything, as the reference's comparison does).
  float top = key_value(h[0].key);
  auto visit = [&](int64_t e) {
    if (x[e] < top) return;
    const int32_t key = order_key(x[e]);
    if (key > h[0].key) {
      replace_top(h.data(), k, {key, static_cast<int32_t>(e)});
      top = key_value(h[0].key);
    }
  };
  int64_t i = k;
  for (; i + kRun <= n; i += kRun) {
    const f32x4 t = {top, top, top, top};
    i32x4 below = {-1, -1, -1, -1};
    for (int64_t j = 0; j < kRun; j += 4) {
      f32x4 v;
      std::memcpy(&v, x + i + j, 16);
      below &= (v < t);
    }
    uint64_t w[2];
    std::memcpy(w, &below, 16);
    if ((w[0] & w[1]) == ~uint64_t{0}) continue;
    for (int64_t e = i; e < i + kRun; ++e) visit(e);
  }
  for (; i < n; ++i) visit(i);
  return h;
}

// The reference's nth_element branch (k·64 > n), on (value, index) pairs as the library sees them.
std::vector<int32_t> nth_select(const float* values, int64_t n, int64_t k) {
  using Elem = std::pair<float, int64_t>;
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[static_cast<size_t>(j)] = {values[j], j};
  auto greater = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
  };
  std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), greater);
  std::vector<int32_t> out(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) out[static_cast<size_t>(j)] = static_cast<int32_t>(q[static_cast<size_t>(j)].second);
  return out;
}

}  // namespace

std::vector<int32_t> torch_topk_indices(const float* values, int64_t n, int64_t k) {
  k = std::min(k, n);
  if (k <= 0) return {};
  if (k * 64 > n) return nth_select(values, n, k);
  std::vector<Ranked> h = heap_select(values, n, k);
  std::sort_heap(h.begin(), h.end(), above);
  std::vector<int32_t> out(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) out[static_cast<size_t>(j)] = h[static_cast<size_t>(j)].index;
  return out;
}

std::vector<int32_t> torch_topk_indices(const std::vector<float>& values, int64_t k) {
  return torch_topk_indices(values.data(), static_cast<int64_t>(values.size()), k);
}

std::vector<int32_t> topk_sorted(const float* values, int64_t n, int64_t k) {
  k = std::min(k, n);
  std::vector<int32_t> idx;
  if (k <= 0) return idx;
  if (k * 64 > n) {
    idx = nth_select(values, n, k);
  } else {
    // only the set matters here: the heap holds it, no need to order it by rank first
    const std::vector<Ranked> h = heap_select(values, n, k);
    idx.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) idx[static_cast<size_t>(j)] = h[static_cast<size_t>(j)].index;
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> topk_sorted(const std::vector<float>& s, int64_t k) {
  return topk_sorted(s.data(), static_cast<int64_t>(s.size()), k);
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
