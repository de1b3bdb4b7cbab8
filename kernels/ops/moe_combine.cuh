// The routed half of moe_combine (block.cpp moe): the rows of token t's slots added at column d in
// increasing expert id, the first slot of a repeated id only, ids < 0 skipped. Shared by the
// moe_combine kernel and the MoE site's fused expand (mhc.cu), so both add in one order.
#pragma once
#include "ops/ops_common.cuh"

namespace dsv41::ops::gpu::dev {

// top_k up to this many slots takes the register form of combine_routed.
constexpr int kCombineRegSlots = 8;

// routed [n*top_k][dim] in pair order; ids: token t's top_k expert ids. top_k is small: the order
// is the repeated minimum.
// For top_k <= kCombineRegSlots the ids are read once into registers, the order is found there, and
// every routed value is requested before the first add (all loads in flight, where the loop below
// waits a memory latency per slot); the adds are the same, in the same order.
__device__ __forceinline__ float combine_routed(const float* routed, const int32_t* ids, int64_t top_k, int64_t dim,
                                                int64_t t, int64_t d) {
  float y = 0.0f;
  if (top_k <= kCombineRegSlots) {
    const int k = static_cast<int>(top_k);
    int id[kCombineRegSlots], slot[kCombineRegSlots];
#pragma unroll
    for (int i = 0; i < kCombineRegSlots; ++i) id[i] = i < k ? ids[i] : -1;
    int count = 0, last = -1;
#pragma unroll
    for (int step = 0; step < kCombineRegSlots; ++step) {
      int best = -1, best_slot = -1;
#pragma unroll
      for (int i = 0; i < kCombineRegSlots; ++i)
        if (id[i] > last && (best < 0 || id[i] < best)) best = id[i], best_slot = i;
      slot[step] = best_slot;
      if (best >= 0) count = step + 1, last = best;
    }
    const float* row = routed + t * top_k * dim + d;
    float v[kCombineRegSlots];
#pragma unroll
    for (int s = 0; s < kCombineRegSlots; ++s) v[s] = s < count ? row[static_cast<int64_t>(slot[s]) * dim] : 0.0f;
#pragma unroll
    for (int s = 0; s < kCombineRegSlots; ++s)
      if (s < count) y = __fadd_rn(y, v[s]);
    return y;
  }
  int last = -1;
  for (int64_t step = 0; step < top_k; ++step) {
    int best = -1, best_slot = -1;
    for (int64_t i = 0; i < top_k; ++i) {
      const int e = ids[i];
      if (e > last && (best < 0 || e < best)) best = e, best_slot = static_cast<int>(i);
    }
    if (best < 0) break;
    y = __fadd_rn(y, routed[(t * top_k + best_slot) * dim + d]);
    last = best;
  }
  return y;
}

}  // namespace dsv41::ops::gpu::dev
