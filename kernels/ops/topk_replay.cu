// The reference's top-k with its tie order, on the device. PyTorch's CPU topk runs
// std::nth_element on (value, index) pairs when k·64 > n, and which of the entries tied with the
// k-th value end up in front depends on every swap libstdc++'s introselect makes; the CPU engine
// replays those swaps (Introselect in src/model/ops/topk.cpp) and this kernel replays the same
// steps, one block per row, so both engines keep the same entries. When k·64 <= n torch runs
// std::partial_sort instead, whose heap is replayed by topk_heap_kernel (further down); a call
// with rows of both kinds (batched decode) launches both kernels, each skipping the other's rows.
//
// A round (more than 3 entries left, depth not exhausted): the median of (first + 1, middle,
// last - 1) is swapped to `first` as the pivot p; then the library's unguarded Hoare partition of
// [first + 1, last) is computed at once from two bitmaps of the range: left stops (key <= p) and
// right stops (key >= p). While the i-th left stop from the left lies before the i-th right stop
// from the right, the scans meet them in that order and swap them (a scan only passes entries no
// swap has touched, up to the other scan's last swap, which stops it); so with m such pairs, every
// pair i < m swaps (disjoint positions: all in parallel) and the scans meet at min(m-th left stop,
// (m-1)-th right stop), the range's end standing in for a stop that does not exist. m is the
// largest min(#left stops before x, #right stops at or after x) over positions x. Rounds over more
// than 32 bitmap words use the block (bitmaps and prefix sums in shared memory), smaller ones warp
// 0 alone (a word per lane, in registers). Past 2·floor(log2 n) rounds the library finishes with a
// heap select, and below 4 entries with an insertion sort: both on one thread (the heap select is
// rare; it is exact, not fast).
//
// Keys are order_key(value) (NaN on top, -0 = +0) with the column indices as uint16 (n <= 65535):
// in shared memory where the row fits (the values are left alone), else written over the values
// and into the index scratch. The k entries in front are written sorted by index, with the
// indexer's visibility rule (TopkArgs), or as the algorithm leaves them (in_select_order).
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ int32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f), mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return INT32_MAX;
  if (mag == 0) return 0;
  return (u >> 31) ? -static_cast<int32_t>(mag) : static_cast<int32_t>(mag);
}

// One row's (key, index) pairs, in shared memory or in global memory.
struct Row {
  int32_t* key;
  uint16_t* idx;
  __device__ void swap(int i, int j) const {
    const int32_t k = key[i];
    key[i] = key[j];
    key[j] = k;
    const uint16_t x = idx[i];
    idx[i] = idx[j];
    idx[j] = x;
  }
  // libstdc++'s __adjust_heap of a heap at `base` ranked by "key above" (the top is the lowest
  // key): the hole walks down to a leaf along the child ranked lower (the right one unless the
  // left ranks lower), then the value climbs back while its parent ranks lower than it.
  __device__ void adjust_heap(int base, int hole, int len, int32_t vk, uint16_t vi) const {
    const int top = hole;
    int child = hole;
    while (child < (len - 1) / 2) {
      child = 2 * (child + 1);
      if (key[base + child] > key[base + child - 1]) --child;
      key[base + hole] = key[base + child];
      idx[base + hole] = idx[base + child];
      hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
      child = 2 * (child + 1);
      key[base + hole] = key[base + child - 1];
      idx[base + hole] = idx[base + child - 1];
      hole = child - 1;
    }
    int parent = (hole - 1) / 2;
    while (hole > top && key[base + parent] > vk) {
      key[base + hole] = key[base + parent];
      idx[base + hole] = idx[base + parent];
      hole = parent;
      parent = (hole - 1) / 2;
    }
    key[base + hole] = vk;
    idx[base + hole] = vi;
  }
  // std::__heap_select(first, middle, last) then iter_swap(first, nth): __make_heap of the front,
  // and each later entry ranked above the top pops it into the entry's place.
  __device__ void heap_select(int first, int middle, int last, int nth) const {
    const int len = middle - first;
    if (len >= 2)
      for (int parent = (len - 2) / 2;; --parent) {
        adjust_heap(first, parent, len, key[first + parent], idx[first + parent]);
        if (parent == 0) break;
      }
    for (int i = middle; i < last; ++i) {
      if (!(key[i] > key[first])) continue;
      const int32_t vk = key[i];
      const uint16_t vi = idx[i];
      key[i] = key[first];
      idx[i] = idx[first];
      adjust_heap(first, 0, len, vk, vi);
    }
    swap(first, nth);
  }
};

// Position of the t-th (0-based) set bit of w (w has more than t set bits).
__device__ __forceinline__ int nth_set_bit(uint32_t w, int t) {
  int pos = 0;
#pragma unroll
  for (int width = 16; width >= 1; width >>= 1) {  // skip the low half while it holds <= t set bits
    const int c = __popc(w & ((1u << width) - 1u));
    if (t >= c) t -= c, w >>= width, pos += width;
  }
  return pos;
}

// Shared state of one row's selection.
struct Shared {
  uint32_t *lbits, *rbits;  // stop bitmaps of the current range, word i = positions 32(w0 + i) ..
  int *lpre, *rpre;         // their popcounts, then exclusive prefix sums
  int* warp_a;
  int* warp_b;
  int nr, nl, m, lm, rm;
};

// In place over nw words: a[i] and b[i] become the sums of a[0..i) and b[0..i); sh.nl and sh.nr
// get the totals. Every thread of the block calls it; it ends with a barrier.
__device__ void exclusive_scan2(int* a, int* b, int nw, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per = (nw + kThreads - 1) / kThreads;
  const int i0 = min(nw, static_cast<int>(threadIdx.x) * per), i1 = min(nw, i0 + per);
  int sa = 0, sb = 0;
  for (int i = i0; i < i1; ++i) sa += a[i], sb += b[i];
  int ia = sa, ib = sb;
  for (int o = 1; o < 32; o <<= 1) {
    const int ta = __shfl_up_sync(dev::kFull, ia, o), tb = __shfl_up_sync(dev::kFull, ib, o);
    if (lane >= o) ia += ta, ib += tb;
  }
  if (lane == 31) sh.warp_a[warp] = ia, sh.warp_b[warp] = ib;
  __syncthreads();
  if (warp == 0) {
    int wa = lane < kWarps ? sh.warp_a[lane] : 0, wb = lane < kWarps ? sh.warp_b[lane] : 0;
    const int own_a = wa, own_b = wb;
    for (int o = 1; o < 32; o <<= 1) {
      const int ta = __shfl_up_sync(dev::kFull, wa, o), tb = __shfl_up_sync(dev::kFull, wb, o);
      if (lane >= o) wa += ta, wb += tb;
    }
    if (lane < kWarps) sh.warp_a[lane] = wa - own_a, sh.warp_b[lane] = wb - own_b;
    if (lane == 31) sh.nl = wa, sh.nr = wb;
  }
  __syncthreads();
  int ea = ia - sa + sh.warp_a[warp], eb = ib - sb + sh.warp_b[warp];
  for (int i = i0; i < i1; ++i) {
    const int va = a[i], vb = b[i];
    a[i] = ea, b[i] = eb;
    ea += va, eb += vb;
  }
  __syncthreads();
}

// The median of (first + 1, middle, last - 1) as std::__move_median_to_first picks it with "ranks
// above": every thread of a round works it out (and the pivot key) from the same reads.
struct Pivot {
  int pos;         // where the median sits; one thread swaps it with first
  int32_t key;     // the pivot p
  int32_t moved;   // key[first], which that swap leaves at pos
};
__device__ __forceinline__ Pivot pick_pivot(const Row& r, int first, int last) {
  const int pa = first + 1, pb = first + (last - first) / 2, pc = last - 1;
  const int32_t ka = r.key[pa], kb = r.key[pb], kc = r.key[pc], kf = r.key[first];
  int med;
  if (ka > kb) med = kb > kc ? pb : ka > kc ? pc : pa;
  else med = ka > kc ? pa : kb > kc ? pc : pb;
  return {med, med == pa ? ka : med == pb ? kb : kc, kf};
}

// m = max over positions x of min(left stops before x, right stops at or after x), over one
// word's 32 positions: l0 left stops before the word, r_after right stops from the word on. The
// first count only grows with x and the second only shrinks, so the largest min sits where they
// cross: a binary search for the last position whose left count is not above its right count.
__device__ __forceinline__ int pairs_in_word(uint32_t lb, uint32_t rb, int l0, int r_after) {
  auto left = [&](int j) { return l0 + __popc(lb & ((1u << j) - 1u)); };
  auto right = [&](int j) { return r_after - __popc(rb & ((1u << j) - 1u)); };
  if (left(0) > right(0)) return right(0);
  int j = 0;
#pragma unroll
  for (int step = 16; step >= 1; step >>= 1)
    if (j + step <= 31 && left(j + step) <= right(j + step)) j += step;
  return j < 31 ? max(left(j), right(j + 1)) : left(j);
}

// The swaps of one word's left stops (bits lb at base, ranks l0 ..) with their partners, the right
// stops of ascending rank NR - 1 - rank, while rank < m: found by binary search over the right
// prefix sums rpre of nw words (word w at w0 + w), then walked downward.
__device__ __forceinline__ void swap_word(const Row& r, uint32_t lb, int base, int l0, int m, int NR, const uint32_t* rbits,
                                          const int* rpre, int nw, int w0) {
  if (l0 >= m || lb == 0) return;
  int rank = l0;
  const int q = NR - 1 - rank;
  int lo_w = 0, hi_w = nw - 1;  // the last word whose rpre <= q holds right rank q
  while (lo_w < hi_w) {
    const int mid = (lo_w + hi_w + 1) >> 1;
    if (rpre[mid] <= q) lo_w = mid;
    else hi_w = mid - 1;
  }
  int rw = lo_w;
  const int top_bit = nth_set_bit(rbits[rw], q - rpre[rw]);
  uint32_t rbw = rbits[rw] & (top_bit == 31 ? ~0u : ((2u << top_bit) - 1u));
  for (uint32_t bits = lb; bits && rank < m; bits &= bits - 1, ++rank) {
    while (rbw == 0) rbw = rbits[--rw];
    const int hb = 31 - __clz(rbw);
    rbw &= ~(1u << hb);
    r.swap(base + __ffs(bits) - 1, (w0 + rw) * 32 + hb);
  }
}

// One introselect round on [first, last) (more than 3 entries) by the whole block: the median of
// three moved to first, the unguarded partition of the rest, and the side holding nth kept. Every
// thread calls it with the same first/last, which it updates; the range is written on return.
__device__ void block_round(const Row& r, int& first, int& last, int nth, Shared& sh) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const Pivot pv = pick_pivot(r, first, last);
  const int lo = first + 1, hi = last, w0 = lo >> 5, nw = ((hi - 1) >> 5) - w0 + 1;
  __syncthreads();  // every thread has read the three and first before the swap
  if (t == 0) {
    r.swap(first, pv.pos);
    sh.m = 0, sh.lm = hi, sh.rm = hi;
  }
#pragma unroll 4
  for (int i = warp; i < nw; i += kWarps) {
    const int x = (w0 + i) * 32 + lane;
    const bool in = x >= lo && x < hi;
    const int32_t kx = !in ? 0 : x == pv.pos ? pv.moved : r.key[x];
    const uint32_t lb = __ballot_sync(dev::kFull, in && kx <= pv.key), rb = __ballot_sync(dev::kFull, in && kx >= pv.key);
    if (lane == 0) {
      sh.lbits[i] = lb, sh.rbits[i] = rb;
      sh.lpre[i] = __popc(lb), sh.rpre[i] = __popc(rb);
    }
  }
  __syncthreads();
  exclusive_scan2(sh.lpre, sh.rpre, nw, sh);
  const int NR = sh.nr;
  int best = 0;
  for (int i = t; i < nw; i += kThreads) best = max(best, pairs_in_word(sh.lbits[i], sh.rbits[i], sh.lpre[i], NR - sh.rpre[i]));
  best = __reduce_max_sync(dev::kFull, best);
  if (lane == 0 && best > 0) atomicMax(&sh.m, best);
  __syncthreads();
  const int m = sh.m;
  for (int i = t; i < nw; i += kThreads) {
    const uint32_t lb = sh.lbits[i], rb = sh.rbits[i];
    const int l0 = sh.lpre[i], r0 = sh.rpre[i], base = (w0 + i) * 32;
    if (m >= l0 && m < l0 + __popc(lb)) sh.lm = base + nth_set_bit(lb, m - l0);  // the m-th left stop
    if (m >= 1 && NR - m >= r0 && NR - m < r0 + __popc(rb)) sh.rm = base + nth_set_bit(rb, NR - m - r0);
    swap_word(r, lb, base, l0, m, NR, sh.rbits, sh.rpre, nw, w0);
  }
  __syncthreads();
  const int cut = min(sh.lm, sh.rm);
  if (cut <= nth) first = cut;
  else last = cut;
}

// The same round by warp 0 alone, for ranges of at most 32 words: lane i owns word i, its bitmaps
// and prefix sums in registers, shuffles instead of barriers. The pairs are listed by rank in
// shared memory (kMaxWarpPairs each side: at most half of 32 words) and swapped 32 at a time, so
// no lane walks a whole word of them.
constexpr int kMaxWarpPairs = 512;
__device__ void warp_round(const Row& r, int& first, int& last, int nth, uint16_t* lpos, uint16_t* rpos) {
  const int lane = threadIdx.x;
  const Pivot pv = pick_pivot(r, first, last);
  const int lo = first + 1, hi = last, w0 = lo >> 5, nw = ((hi - 1) >> 5) - w0 + 1;
  __syncwarp();
  if (lane == 0) r.swap(first, pv.pos);
  uint32_t lb = 0, rb = 0;
#pragma unroll 4
  for (int i = 0; i < nw; ++i) {
    const int x = (w0 + i) * 32 + lane;
    const bool in = x >= lo && x < hi;
    const int32_t kx = !in ? 0 : x == pv.pos ? pv.moved : r.key[x];
    const uint32_t bl = __ballot_sync(dev::kFull, in && kx <= pv.key), br = __ballot_sync(dev::kFull, in && kx >= pv.key);
    if (lane == i) lb = bl, rb = br;
  }
  const int base = (w0 + lane) * 32;
  int l_incl = __popc(lb), r_incl = __popc(rb);
  for (int o = 1; o < 32; o <<= 1) {
    const int ta = __shfl_up_sync(dev::kFull, l_incl, o), tb = __shfl_up_sync(dev::kFull, r_incl, o);
    if (lane >= o) l_incl += ta, r_incl += tb;
  }
  const int l0 = l_incl - __popc(lb), r0 = r_incl - __popc(rb), NR = __shfl_sync(dev::kFull, r_incl, 31);
  const int m = __reduce_max_sync(dev::kFull, lane < nw ? pairs_in_word(lb, rb, l0, NR - r0) : 0);
  int lm = hi, rm = hi;
  if (m >= l0 && m < l_incl) lm = base + nth_set_bit(lb, m - l0);
  if (m >= 1 && NR - m >= r0 && NR - m < r_incl) rm = base + nth_set_bit(rb, NR - m - r0);
  const int cut = min(__reduce_min_sync(dev::kFull, lm), __reduce_min_sync(dev::kFull, rm));
  // left stop of rank i and right stop of rank i from the right, for i < m
  int rank = l0;
  for (uint32_t bits = lb; bits && rank < m; bits &= bits - 1, ++rank) lpos[rank] = static_cast<uint16_t>(base + __ffs(bits) - 1);
  rank = NR - r_incl;  // descending rank of this word's highest right stop
  for (uint32_t bits = rb; bits && rank < m; ++rank) {
    const int hb = 31 - __clz(bits);
    bits &= ~(1u << hb);
    rpos[rank] = static_cast<uint16_t>(base + hb);
  }
  __syncwarp();  // the lists are written, the pivot swap is done
  for (int i = lane; i < m; i += 32) r.swap(lpos[i], rpos[i]);
  __syncwarp();
  if (cut <= nth) first = cut;
  else last = cut;
}

// Dynamic shared memory of a row of n: four bitmap-sized arrays, then (resident) keys and indices.
__host__ __device__ constexpr size_t smem_bytes(int64_t n, bool resident) {
  const size_t words = static_cast<size_t>((n + 31) / 32) * 16;
  return resident ? words + static_cast<size_t>(n) * 4 + static_cast<size_t>((n + 1) / 2) * 4 : words;
}

__global__ void __launch_bounds__(kThreads) topk_replay_kernel(TopkReplayArgs a, bool resident) {
  dev::pdl_enter();
  extern __shared__ uint32_t words[];
  __shared__ int warp_a[kWarps], warp_b[kWarps];
  __shared__ Shared sh;
  __shared__ uint16_t pair_l[kMaxWarpPairs], pair_r[kMaxWarpPairs];
  const int64_t row = blockIdx.x;
  int n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  int64_t out_off = row * a.k, n_vis = a.ratio > 0 ? (a.pos0 + row + 1) / a.ratio : a.n;
  if (a.positions) {  // batched decode: this row's own width, after the rows before it
    out_off = 0;
    for (int64_t j = 0; j < row; ++j) out_off += min(a.k, (a.positions[j] + 1) / a.ratio);
    n = static_cast<int>((a.positions[row] + 1) / a.ratio);
    k = min(k, n);
    n_vis = n;
    if (k == 0) return;
  }
  if (static_cast<int64_t>(k) * 64 <= n) return;  // the partial_sort branch: topk_heap_kernel
  const int nth = k - 1, W = (n + 31) / 32;
  const float* values = a.values + row * a.stride;
  // The row's keys and indices: in shared memory when they fit (resident), else over the values
  // and in the index scratch.
  Row r{reinterpret_cast<int32_t*>(a.values + row * a.stride), a.idx + row * a.stride};
  if (resident) r = Row{reinterpret_cast<int32_t*>(words + 4 * W), reinterpret_cast<uint16_t*>(words + 4 * W + n)};
  if (threadIdx.x == 0) {
    sh.lbits = words, sh.rbits = words + W;
    sh.lpre = reinterpret_cast<int*>(words + 2 * W), sh.rpre = sh.lpre + W;
    sh.warp_a = warp_a, sh.warp_b = warp_b;
  }
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const int32_t key = order_key(values[j]);  // (not resident: the same thread writes over it)
    r.key[j] = key;
    r.idx[j] = static_cast<uint16_t>(j);
  }
  __syncthreads();
  int first = 0, last = n, depth = 0;
  for (int v = n; v > 1; v >>= 1) depth += 2;
  // Rounds over more than 32 words with the block, then warp 0 alone.
  while (last - first > 3 && depth > 0 && ((last - 1) >> 5) - ((first + 1) >> 5) >= 32) {
    --depth;
    block_round(r, first, last, nth, sh);
  }
  if (threadIdx.x < 32) {
    while (last - first > 3 && depth > 0) {
      --depth;
      warp_round(r, first, last, nth, pair_l, pair_r);
    }
    if (threadIdx.x == 0) {
      if (last - first > 3) r.heap_select(first, nth + 1, last, nth);  // past the depth limit
      else  // the library's insertion sort of the last <= 3: stable by rank
        for (int i = first + 1; i < last; ++i)
          for (int j = i; j > first && r.key[j] > r.key[j - 1]; --j) r.swap(j, j - 1);
    }
  }
  __syncthreads();

  int32_t* out = a.out + out_off;
  if (a.in_select_order) {
    for (int j = threadIdx.x; j < k; j += kThreads) out[j] = r.idx[j];
    return;
  }
  // The k entries in front, sorted by index: a bitmap of them, then its set bits in order.
  for (int i = threadIdx.x; i < W; i += kThreads) sh.lbits[i] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += kThreads) {
    const int e = r.idx[j];
    atomicOr(&sh.lbits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < W; i += kThreads) sh.lpre[i] = __popc(sh.lbits[i]), sh.rpre[i] = 0;
  __syncthreads();
  exclusive_scan2(sh.lpre, sh.rpre, W, sh);
  for (int i = threadIdx.x; i < W; i += kThreads) {
    int pos = sh.lpre[i];
    for (uint32_t bits = sh.lbits[i]; bits; bits &= bits - 1) {
      const int e = i * 32 + __ffs(bits) - 1;
      out[pos++] = e >= n_vis ? -1 : e;
    }
  }
}

// ---- the partial_sort branch (k·64 <= n) ----
// std::partial_sort's selection: a heap of the first k entries (std::make_heap), then every later
// entry ranked above the heap's top replaces it (the pop-heap step with a value); which of the
// entries tied with the k-th value survive depends on the heap's exact layout at every step. One
// warp per row, the heap in shared memory as packed (key, column) nodes.
//
// libstdc++'s step walks the hole from the top to a leaf along the lower-ranked child (the right
// one unless the left ranks lower, a lone last child taken at the end) and lets the value climb
// back while its parent ranks lower. Keys never decrease down that path, so the value ends below
// exactly the path nodes whose key is <= its own: sift() walks the same path from the top and
// stops at the first child whose key is above the value's, the same layout without the climb.
// Node i sits in slot i + 1, so a node's children, grandchildren and great-grandchildren are
// aligned runs of 2, 4 and 8 slots: where all of them exist, one round of loads decides three
// levels; the last levels go one at a time with the library's bounds.
//
// The row streams through in chunks of 256 columns, loaded into registers one chunk ahead and
// parked in shared memory as keys; a chunk whose keys all fail against the top is skipped with one
// vote (an entry that fails against an older top fails against every later one: the top only
// rises), otherwise 32 columns at a time are voted and lane 0 replaces the top for each entrant in
// column order. Shared memory stays small (k + 2 nodes and the chunk) so that a prefill pass's
// rows run in one wave. A single row is slow (~1 ms at 65,536 columns: thousands of dependent
// heap steps on one thread), so the engine sends few rows to the host instead.
constexpr int kHeapThreads = 32;
constexpr int kHeapChunk = 256;  // columns per register stage: 8 per lane

__device__ __forceinline__ int32_t node_key(uint64_t v) { return static_cast<int32_t>(v >> 32); }
__device__ __forceinline__ uint64_t make_node(int32_t key, int32_t col) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(key)) << 32) | static_cast<uint32_t>(col);
}
// Of a left/right pair of nodes, the one the library's walk takes (the right one unless the left
// ranks lower); sets `left`.
__device__ __forceinline__ uint64_t walk_child(ulonglong2 pair, bool& left) {
  left = node_key(pair.y) > node_key(pair.x);
  return left ? pair.x : pair.y;
}

// __adjust_heap(first, hole, len, v) on the heap `slot` (node i in slot[i + 1]).
__device__ __forceinline__ void sift(uint64_t* slot, int hole, int len, uint64_t v) {
  const int32_t vk = node_key(v);
  for (;;) {
    if (8 * hole + 15 <= len) {  // three levels below the hole, all present
      const ulonglong2* c = reinterpret_cast<const ulonglong2*>(slot + 2 * hole + 2);
      const ulonglong2* g = reinterpret_cast<const ulonglong2*>(slot + 4 * hole + 4);
      const ulonglong2* e = reinterpret_cast<const ulonglong2*>(slot + 8 * hole + 8);
      const ulonglong2 c0 = c[0], g0 = g[0], g1 = g[1], e0 = e[0], e1 = e[1], e2 = e[2], e3 = e[3];
      bool l1, l2, l3;
      const uint64_t n1 = walk_child(c0, l1);
      if (node_key(n1) > vk) break;
      slot[hole + 1] = n1;
      hole = 2 * hole + (l1 ? 1 : 2);
      const uint64_t n2 = walk_child(l1 ? g0 : g1, l2);
      if (node_key(n2) > vk) break;
      slot[hole + 1] = n2;
      hole = 2 * hole + (l2 ? 1 : 2);
      const uint64_t n3 = walk_child(l1 ? (l2 ? e0 : e1) : (l2 ? e2 : e3), l3);
      if (node_key(n3) > vk) break;
      slot[hole + 1] = n3;
      hole = 2 * hole + (l3 ? 1 : 2);
    } else {
      const int right = 2 * hole + 2;  // the right child's node, the left child's slot
      if (right > len) break;          // a leaf
      bool left = true;                // a lone last child is taken
      const uint64_t child =
          right < len ? walk_child(*reinterpret_cast<const ulonglong2*>(slot + right), left) : slot[right];
      if (node_key(child) > vk) break;
      slot[hole + 1] = child;
      hole = left ? right - 1 : right;
    }
  }
  slot[hole + 1] = v;
}

// Dynamic shared memory: the heap's k + 2 slots (slot 0 unused, one past the end for the last pair
// load), then the chunk's keys.
__host__ __device__ constexpr size_t heap_smem_bytes(int64_t k) {
  return static_cast<size_t>(k + 2) * 8 + kHeapChunk * 4;
}

__global__ void __launch_bounds__(kHeapThreads) topk_heap_kernel(TopkReplayArgs a) {
  dev::pdl_enter();
  extern __shared__ ulonglong2 heap_words[];
  uint64_t* slot = reinterpret_cast<uint64_t*>(heap_words);
  const int lane = threadIdx.x;
  const int64_t row = blockIdx.x;
  int n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  int64_t out_off = row * a.k, n_vis = a.ratio > 0 ? (a.pos0 + row + 1) / a.ratio : a.n;
  if (a.positions) {
    out_off = 0;
    for (int64_t j = 0; j < row; ++j) out_off += min(a.k, (a.positions[j] + 1) / a.ratio);
    n = static_cast<int>((a.positions[row] + 1) / a.ratio);
    k = min(k, n);
    n_vis = n;
  }
  if (k == 0 || static_cast<int64_t>(k) * 64 > n) return;  // the nth_element branch: topk_replay_kernel
  int32_t* chunk_keys = reinterpret_cast<int32_t*>(slot + a.k + 2);
  const float* values = a.values + row * a.stride;
  for (int j = lane; j < k; j += kHeapThreads) slot[j + 1] = make_node(order_key(values[j]), j);
  __syncwarp();
  // std::make_heap: __adjust_heap from node (k - 2) / 2 down to 0. A node's step only touches its
  // own subtree, and every node of a level comes before the level above: a level's nodes at once.
  int top_level = 0;
  while ((2 << top_level) - 1 <= (k - 2) / 2) ++top_level;  // the level of node (k - 2) / 2
  for (int level = top_level; level >= 0; --level) {
    const int lo = (1 << level) - 1, hi = min(2 * lo, (k - 2) / 2);
    for (int p = lo + lane; p <= hi; p += kHeapThreads) sift(slot, p, k, slot[p + 1]);
    __syncwarp();
  }
  // Entrants in column order, a chunk at a time, the next chunk's loads in flight meanwhile.
  constexpr int kPer = kHeapChunk / 32;
  float next[kPer];
  auto load = [&](int base) {
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int j = base + 32 * m + lane;
      next[m] = j < n ? values[j] : __int_as_float(0xff800000u);  // -inf: never enters (the top is >= it)
    }
  };
  int32_t top = node_key(slot[1]);
  if (k < n) load(k);
  for (int base = k; base < n; base += kHeapChunk) {
    int32_t most = INT32_MIN;
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int32_t key = order_key(next[m]);
      chunk_keys[32 * m + lane] = key;
      most = max(most, key);
    }
    if (base + kHeapChunk < n) load(base + kHeapChunk);
    if (!__any_sync(dev::kFull, most > top)) continue;
    __syncwarp();
    for (int m = 0; m < kPer; ++m) {
      const int32_t key = chunk_keys[32 * m + lane];
      uint32_t enter = __ballot_sync(dev::kFull, key > top);
      while (enter) {
        const int l = __ffs(enter) - 1;
        if (lane == 0) sift(slot, 0, k, make_node(chunk_keys[32 * m + l], base + 32 * m + l));
        __syncwarp();
        top = node_key(slot[1]);
        enter &= __ballot_sync(dev::kFull, key > top) & ~((2u << l) - 1u);
      }
    }
    __syncwarp();  // the chunk's keys are read before the next chunk's are written
  }
  int32_t* out = a.out + out_off;
  if (a.in_select_order) {  // std::sort_heap, as torch's topk leaves the entries
    if (lane == 0)
      for (int last = k - 1; last > 0; --last) {
        const uint64_t v = slot[last + 1];
        slot[last + 1] = slot[1];
        sift(slot, 0, last, v);
      }
    __syncwarp();
    for (int j = lane; j < k; j += kHeapThreads) out[j] = static_cast<int32_t>(static_cast<uint32_t>(slot[j + 1]));
    return;
  }
  // Sorted by column: each entry's place is the number of selected columns below its own.
  for (int j = lane; j < k; j += kHeapThreads) {
    const int col = static_cast<int>(static_cast<uint32_t>(slot[j + 1]));
    int below = 0;
    for (int i = 1; i <= k; ++i) below += static_cast<int>(static_cast<uint32_t>(slot[i])) < col;
    out[below] = col >= n_vis ? -1 : col;
  }
}

}  // namespace

namespace raw {
cudaError_t topk_replay(const TopkReplayArgs& a, cudaStream_t s) {
  if (a.rows == 0 || a.k == 0) return cudaSuccess;
  // The shared-memory opt-in is a function attribute, not a stream operation: raised once per
  // device to all the device allows, so no launch inside a graph capture needs it.
  static int optin[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  if (optin[dev] == 0) {
    const int limit = static_cast<int>(max_dynamic_smem(topk_replay_kernel));  // GB10: 99 KB less the static part
    if (limit <= 0) return cudaErrorInvalidValue;
    e = raise_dynamic_smem(topk_replay_kernel, static_cast<size_t>(limit));
    if (e != cudaSuccess) return e;
    optin[dev] = limit;
  }
  // Rows of either branch: the nth_element rows have fewer than 64·k columns (all of them when the
  // widest row does), the partial_sort rows 64·k or more (none when the widest row has fewer).
  const int64_t nth_n = a.n < 64 * a.k - 1 ? a.n : 64 * a.k - 1;
  if (nth_n >= 1 && (a.positions || a.k * 64 > a.n)) {
    const bool resident = a.force_global ? false : smem_bytes(nth_n, true) <= static_cast<size_t>(optin[dev]);
    launch_pdl(topk_replay_kernel, static_cast<unsigned>(a.rows), kThreads, smem_bytes(nth_n, resident), s, a,
               resident);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (a.k * 64 <= a.n) {
    launch_pdl(topk_heap_kernel, static_cast<unsigned>(a.rows), kHeapThreads, heap_smem_bytes(a.k), s, a);
    e = cudaGetLastError();
  }
  return e;
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
