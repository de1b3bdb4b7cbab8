// The routed half of moe_combine (block.cpp moe): the rows of token t's slots added at column d in
// increasing expert id, the first slot of a repeated id only, ids < 0 skipped. Shared by the
// moe_combine kernel and the MoE site's fused expand (mhc.cu), so both add in one order.
#pragma once
#include "ops/ops_common.cuh"

namespace dsv41::ops::gpu::dev {

// routed [n*top_k][dim] in pair order; ids: token t's top_k expert ids. top_k is small: the order
// is the repeated minimum.
__device__ __forceinline__ float combine_routed(const float* routed, const int32_t* ids, int64_t top_k, int64_t dim,
                                                int64_t t, int64_t d) {
  float y = 0.0f;
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
