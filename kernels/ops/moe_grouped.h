// The grouped tensor-core path of the routed FP4 experts (kernels/ops/moe_grouped.cu): the
// (token, slot) pairs are bucketed by expert on the device (counting sort), then per expert a tiled
// matmul on the tensor cores runs the gate/up projections with the clamped SwiGLU and the routing
// weight in its epilogue, ActQuant8 quantises the result, and a second tiled matmul runs the down
// projection. Weight e2m1 codes and activation e4m3 codes are widened exactly to fp16; each 32-wide
// K block's dot product comes from the tensor core (two chained m16n8k16 steps, its own summation
// order and accumulator precision), is scaled by act_scale·w_scale and added in increasing K order
// in fp32 registers — the reference's block order, so only the rare rounding of a 32-term sum
// differs from the CPU engine's sequential fp32 sums (not guaranteed bit-identical; every case
// measured so far was: tests/gpu_ops/moe_grouped_test.cpp, tests/bench/bench_gpu_moe_grouped.cpp).
// The launcher trusts its arguments; the validated entry point is gpu::moe_grouped (gpu_ops.h).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {

// Pairs per expert tile (the tensor-core N side): a tile holds up to this many pairs of one expert.
inline constexpr int64_t kMoeGroupedTilePairs = 64;
// K granularity of the tiled matmuls: both hidden_size and moe_intermediate_size must be multiples.
inline constexpr int64_t kMoeGroupedKStep = 128;

// Most expert tiles `pairs` pairs over `n_experts` experts can need: sum of ceil(count/tile) over
// the non-empty experts <= pairs/tile + min(pairs, n_experts).
inline int64_t moe_grouped_max_tiles(int64_t pairs, int64_t n_experts) {
  return pairs / kMoeGroupedTilePairs + std::min(pairs, n_experts);
}
// int32 scratch of the bucketing: offsets [E+1], tile count [1], tile experts / starts [T] each,
// the pairs sorted by expert [pairs].
inline int64_t moe_grouped_sort_ints(int64_t pairs, int64_t n_experts) {
  return n_experts + 2 + 2 * moe_grouped_max_tiles(pairs, n_experts) + pairs;
}
// The shapes the tiled matmuls take (K steps of 128; the caller falls back to lin4 otherwise).
inline bool moe_grouped_supported(int64_t dim, int64_t inter) {
  return dim > 0 && inter > 0 && dim % kMoeGroupedKStep == 0 && inter % kMoeGroupedKStep == 0;
}

// Routed experts of n tokens with top_k slots each: pair p = t*top_k + s.
//   act[p]  = bf16(SwiGLU_clamped(bf16(w1_e·x_t), bf16(w3_e·x_t)) · route_w[p])   (e = expert_ids[p])
//   y[p]    = bf16(w2_e · ActQuant8(act[p]))
// A pair whose id is outside [0, n_experts) gets a zero row in y (another rank's expert under
// tensor parallelism); its act row is left as it was.
struct MoeGroupedArgs {
  Fp4Weight w1, w3;  // [E][inter][dim/2] packed, [E][inter][dim/32] E8M0
  Fp4Weight w2;      // [E][dim][inter/2], [E][dim][inter/32]
  const uint8_t* x_codes = nullptr;  // ActQuant8 of the n token rows: [n][dim] e4m3
  const float* x_scales = nullptr;   // [n][dim/32]
  int64_t n = 0, top_k = 1;
  const int32_t* expert_ids = nullptr;  // [n*top_k] bank-local expert ids
  const float* route_w = nullptr;       // [n*top_k] routing weights
  float swiglu_limit = 0.0f;            // <= 0: no clamp
  float* act = nullptr;                 // [n*top_k][inter] scratch (SwiGLU outputs, bf16 values)
  uint8_t* act_codes = nullptr;         // [n*top_k][inter] scratch; may alias x_codes (read first)
  float* act_scales = nullptr;          // [n*top_k][inter/32] scratch; may alias x_scales
  int32_t* sort = nullptr;              // scratch of sort_ints int32 values
  int64_t sort_ints = 0;
  float* y = nullptr;  // [n*top_k][dim] routed outputs (bf16 values), pair order
};

namespace raw {
cudaError_t moe_grouped(const MoeGroupedArgs& a, cudaStream_t s);
}  // namespace raw

}  // namespace dsv41::ops::gpu
