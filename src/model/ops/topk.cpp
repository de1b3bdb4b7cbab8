#include "model/ops/topk.h"

#include <algorithm>
#include <bit>
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
// pop-heap step with a value walks the hole at the root down to a leaf along the lower-ranked
// children (the right one unless the left ranks lower, a lone last child taken at the end) and
// lets the new entry climb back while its parent ranks below it. That exact walk decides where
// tied entries sit, hence which of them a later replacement evicts: the reference's tie order.
// Keys never decrease down the walk, so the entry ends right below the walk's last node whose key
// is <= its own: this walks the same path from the top and stops at the first child whose key is
// above the entry's, the same layout without the climb. Where a hole's great-grandchildren all
// exist, the 14 nodes of three levels are read at once and the path through them picked from
// loaded values (the reads do not wait on the picks).
void replace_top(Ranked* h, int64_t len, Ranked v) {
  int64_t hole = 0;
  for (;;) {
    if (8 * hole + 14 < len) {
      const Ranked* c = h + 2 * hole + 1;  // children, grandchildren, great-grandchildren: runs of 2, 4, 8
      const Ranked* g = h + 4 * hole + 3;
      const Ranked* e = h + 8 * hole + 7;
      const int l1 = c[1].key > c[0].key ? 0 : 1;  // 0: the left child
      if (c[l1].key > v.key) break;
      h[hole] = c[l1];
      hole = 2 * hole + 1 + l1;
      const Ranked* g2 = g + 2 * l1;
      const int l2 = g2[1].key > g2[0].key ? 0 : 1;
      if (g2[l2].key > v.key) break;
      h[hole] = g2[l2];
      hole = 2 * hole + 1 + l2;
      const Ranked* e3 = e + 4 * l1 + 2 * l2;
      const int l3 = e3[1].key > e3[0].key ? 0 : 1;
      if (e3[l3].key > v.key) break;
      h[hole] = e3[l3];
      hole = 2 * hole + 1 + l3;
    } else {
      const int64_t right = 2 * hole + 2;
      if (right > len) break;  // no children
      const int64_t child = right == len ? right - 1 : right - (h[right].key > h[right - 1].key);
      if (h[child].key > v.key) break;
      h[hole] = h[child];
      hole = child;
    }
  }
  h[hole] = v;
}

// 64 flags of 0 or 1 into a word, bit j = f[j]: per 8 bytes, the multiply moves byte j's bit
// to bit 56 + j without carries into the top byte.
inline uint64_t pack_flags(const uint8_t* f) {
  uint64_t out = 0;
  for (int g = 0; g < 8; ++g) {
    uint64_t x;
    std::memcpy(&x, f + 8 * g, 8);
    out |= ((x * 0x0102040810204080ull) >> 56) << (8 * g);
  }
  return out;
}

// std::partial_sort's selection phase over (values[j], j): a heap of the first k entries, then every
// later entry that ranks above the heap's top replaces it, in index order. Returns the heap (the k
// selected entries in the standard library's heap layout). Runs of 64 entries are compared with
// the top's value at once (byte flags, vectorised, packed into a word); only the entries not below
// it are visited, by their set bits, and tested exactly (the top only rises, so an entry below an
// older top stays out).
std::vector<Ranked> heap_select(const float* x, int64_t n, int64_t k) {
  std::vector<Ranked> h(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) h[static_cast<size_t>(j)] = {order_key(x[j]), static_cast<int32_t>(j)};
  std::make_heap(h.begin(), h.end(), above);
  constexpr int64_t kRun = 64;
  // An entry can enter only if it is not below the top's value (a NaN top: nothing is below it, and
  // the key test then rejects everything, as the reference's comparison does).
  float top = key_value(h[0].key);
  auto visit = [&](int64_t e) {
    const int32_t key = order_key(x[e]);
    if (key > h[0].key) {
      replace_top(h.data(), k, {key, static_cast<int32_t>(e)});
      top = key_value(h[0].key);
    }
  };
  int64_t i = k;
  for (; i + kRun <= n; i += kRun) {
    uint8_t in[kRun];
    for (int64_t j = 0; j < kRun; ++j) in[j] = !(x[i + j] < top);
    for (uint64_t bits = pack_flags(in); bits; bits &= bits - 1) visit(i + std::countr_zero(bits));
  }
  for (; i < n; ++i)
    if (!(x[i] < top)) visit(i);
  return h;
}

// ---- the nth_element branch (k·64 > n) ----
// The reference runs std::nth_element on (value, index) pairs; which of the entries tied with the
// k-th value end up in front depends on every step the library takes, so this replays them: the
// introselect of libstdc++ (while more than 3 entries remain: past 2·floor(log2 n) rounds a heap
// select, else the median of (first + 1, middle, last - 1) moved to the front as the pivot, an
// unguarded Hoare partition of the rest, and the side holding the k-th position kept; then an
// insertion sort of the last <= 3), on keys (order_key) and indices in two arrays. The partition
// makes the library's swaps, but finds the scans' stops in bitmaps built branch-free for the whole
// range first, instead of one unpredictable compare per entry. A scan only passes entries no swap
// has touched, up to the position the other scan last swapped into, which stops it (it holds an
// entry the other scan stopped at): so the original keys decide every stop but that one, and the
// walk bounds each scan by it. tests/model/topk_test.cpp checks it against std::nth_element.
class Introselect {
 public:
  Introselect(const float* values, int64_t n)
      : key_(static_cast<size_t>(n)), idx_(static_cast<size_t>(n)), stop_left_(static_cast<size_t>(n / 64 + 1)),
        stop_right_(static_cast<size_t>(n / 64 + 1)) {
    for (int64_t j = 0; j < n; ++j) key_[static_cast<size_t>(j)] = order_key(values[j]), idx_[static_cast<size_t>(j)] = static_cast<int32_t>(j);
  }

  // Runs the selection for position nth; returns the indices at positions [0, k).
  std::vector<int32_t> select(int64_t nth, int64_t k) {
    const int64_t n = static_cast<int64_t>(key_.size());
    int64_t first = 0, last = n, depth = 2 * floor_log2(n);
    while (last - first > 3) {
      if (depth == 0) {
        heap_select(first, nth + 1, last);
        swap(first, nth);
        return head(k);
      }
      --depth;
      move_median_to(first, first + 1, first + (last - first) / 2, last - 1);
      const int64_t cut = partition(first + 1, last, key_[static_cast<size_t>(first)]);
      if (cut <= nth) first = cut;
      else last = cut;
    }
    // the library's insertion sort of <= 3 entries is a stable sort by rank
    for (int64_t i = first + 1; i < last; ++i)
      for (int64_t j = i; j > first && key_[static_cast<size_t>(j)] > key_[static_cast<size_t>(j - 1)]; --j) swap(j, j - 1);
    return head(k);
  }

 private:
  static int64_t floor_log2(int64_t n) {
    int64_t r = 0;
    while (n > 1) n >>= 1, ++r;
    return r;
  }
  std::vector<int32_t> head(int64_t k) const { return std::vector<int32_t>(idx_.begin(), idx_.begin() + k); }
  void swap(int64_t i, int64_t j) {
    std::swap(key_[static_cast<size_t>(i)], key_[static_cast<size_t>(j)]);
    std::swap(idx_[static_cast<size_t>(i)], idx_[static_cast<size_t>(j)]);
  }
  bool ranks_above(int64_t i, int64_t j) const { return key_[static_cast<size_t>(i)] > key_[static_cast<size_t>(j)]; }

  // The median of x, y, z swapped into `result`, with the library's comparisons.
  void move_median_to(int64_t result, int64_t x, int64_t y, int64_t z) {
    int64_t m;
    if (ranks_above(x, y)) m = ranks_above(y, z) ? y : ranks_above(x, z) ? z : x;
    else m = ranks_above(x, z) ? x : ranks_above(y, z) ? z : y;
    swap(result, m);
  }

  // Bits of [lo, hi): stop_left_ where the left scan stops (key <= p: not above the pivot),
  // stop_right_ where the right scan stops (key >= p). Word w holds positions 64w .. 64w + 63;
  // bits outside [lo, hi) in the words written are zero.
  void build_bits(int64_t lo, int64_t hi, int32_t p) {
    const int32_t* key = key_.data();
    for (int64_t w = lo / 64; w * 64 < hi; ++w) {
      uint64_t l = 0, r = 0;
      const int64_t base = w * 64, b0 = std::max(lo, base), b1 = std::min(hi, base + 64);
      if (b0 == base && b1 == base + 64) {  // a whole word: byte flags (vectorised), then packed
        uint8_t le[64], ge[64];
        for (int j = 0; j < 64; ++j) {
          le[j] = key[base + j] <= p;
          ge[j] = key[base + j] >= p;
        }
        l = pack_flags(le);
        r = pack_flags(ge);
      } else {
        for (int64_t i = b0; i < b1; ++i) {
          l |= static_cast<uint64_t>(key[i] <= p) << (i - base);
          r |= static_cast<uint64_t>(key[i] >= p) << (i - base);
        }
      }
      stop_left_[static_cast<size_t>(w)] = l;
      stop_right_[static_cast<size_t>(w)] = r;
    }
  }

  // The library's unguarded partition of [lo, hi) around pivot key p (held at lo - 1): the left
  // scan moves up past entries ranked above p, the right scan down past entries ranked below it,
  // each stopped pair is swapped; returns where the scans met. The cursors hand out the set bits
  // in scan order: left upward from lo, right downward from hi - 1.
  int64_t partition(int64_t lo, int64_t hi, int32_t p) {
    build_bits(lo, hi, p);
    const int64_t lo_word = lo / 64, hi_word = (hi - 1) / 64;
    int64_t lw = lo_word, rw = hi_word;
    uint64_t lbits = stop_left_[static_cast<size_t>(lw)], rbits = stop_right_[static_cast<size_t>(rw)];
    int64_t bound = hi;  // where the right scan last swapped: the left scan stops there at the latest
    for (;;) {
      int64_t f = bound;
      for (;;) {
        if (lbits) {
          f = std::min(bound, lw * 64 + std::countr_zero(lbits));
          lbits &= lbits - 1;
          break;
        }
        if (++lw > hi_word || lw * 64 >= bound) break;
        lbits = stop_left_[static_cast<size_t>(lw)];
      }
      // Below f every entry stops the right scan (passed by the left scan: above p; swapped by it:
      // not below p; or the pivot), so a right stop at or below f ends the partition at f.
      int64_t r = -1;
      for (;;) {
        if (rbits) {
          r = rw * 64 + 63 - std::countl_zero(rbits);
          rbits &= ~(uint64_t{1} << (r - rw * 64));
          break;
        }
        if (--rw < lo_word || rw * 64 + 63 <= f) break;
        rbits = stop_right_[static_cast<size_t>(rw)];
      }
      if (r <= f) return f;
      swap(f, r);
      bound = r;
      // Stops on both sides in a row (entries equal to the pivot, e.g. a prefill row's not yet
      // visible columns, all -inf) pair up as the scans would stop at them one by one: when the
      // next 4 on each side are stops, swap the pairs (f + i, r - i) of both runs as one block,
      // within the two bitmap words. (Random scores rarely pass the test: no branch to mispredict.)
      const int64_t fo = f - lw * 64, ro = r - rw * 64;
      if (fo <= 59 && ro >= 4 && (lbits >> (fo + 1) & 0xF) == 0xF && (rbits >> (ro - 4) & 0xF) == 0xF) {
        const int64_t more = std::min({static_cast<int64_t>(std::countr_one(lbits >> (fo + 1))),
                                       static_cast<int64_t>(std::countl_one(rbits << (64 - ro))), (r - f - 1) / 2});
        for (int64_t i = 1; i <= more; ++i) swap(f + i, r - i);
        bound = r - more;
        lbits = fo + 1 + more < 64 ? lbits & (~uint64_t{0} << (fo + 1 + more)) : 0;
        rbits = ro - more > 0 ? rbits & ((uint64_t{1} << (ro - more)) - 1) : 0;
      }
    }
  }

  // Past the depth limit: the library's heap select of [first, last) into [first, middle): a heap
  // of the first entries, then every later entry ranked above the heap's top takes the top's
  // place in the heap (the pop-heap walk, replace_top) and leaves the old top at its position.
  void heap_select(int64_t first, int64_t middle, int64_t last) {
    std::vector<Ranked> h;
    for (int64_t i = first; i < middle; ++i) h.push_back({key_[static_cast<size_t>(i)], idx_[static_cast<size_t>(i)]});
    std::make_heap(h.begin(), h.end(), above);
    for (int64_t i = middle; i < last; ++i) {
      const auto u = static_cast<size_t>(i);
      if (key_[u] <= h[0].key) continue;
      const Ranked v{key_[u], idx_[u]};
      key_[u] = h[0].key;
      idx_[u] = h[0].index;
      replace_top(h.data(), static_cast<int64_t>(h.size()), v);
    }
    for (size_t j = 0; j < h.size(); ++j) {
      key_[static_cast<size_t>(first) + j] = h[j].key;
      idx_[static_cast<size_t>(first) + j] = h[j].index;
    }
  }

  std::vector<int32_t> key_, idx_;
  std::vector<uint64_t> stop_left_, stop_right_;
};

std::vector<int32_t> nth_select(const float* values, int64_t n, int64_t k) {
  return Introselect(values, n).select(k - 1, k);
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
