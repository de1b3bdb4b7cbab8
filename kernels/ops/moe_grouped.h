// The grouped tensor-core path of the routed FP4 experts (kernels/ops/moe_grouped.cu): the
// (token, slot) pairs are bucketed by expert on the device (counting sort), then per expert a tiled
// matmul on the tensor cores runs the gate/up projections with the clamped SwiGLU and the routing
// weight in its epilogue, ActQuant8 quantises the result, and a second tiled matmul runs the down
// projection. Weight e2m1 codes and activation e4m3 codes are widened exactly to fp16. By default
// (the scaled path's whole-K form) the activations enter as f16 rows that carry their block scales
// and the weights as code · 2^(block scale - the row's reference scale), so the MMAs' fp32
// accumulators sum the whole K, as a bf16 GEMM's do; the reference's order is kept with
// MoeGroupedArgs::block_fold (and on the codes path): each 32-wide K block's dot product from the
// tensor core (two chained m16n8k16 steps), scaled by act_scale·w_scale and added in increasing K
// order in fp32 registers, so only the rare rounding of a 32-term sum differs from the CPU engine's
// sequential fp32 sums. Neither is bit-identical to the CPU; both stay within the bf16 NMSE bound
// (tests/gpu_ops/moe_grouped_test.cpp, tests/bench/bench_gpu_moe_grouped.cpp).
// The launcher trusts its arguments; the validated entry point is gpu::moe_grouped (gpu_ops.h).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {

// Pairs per expert tile (the tensor-core N side) of the widest tile shape; narrower shapes hold 32
// or 16 pairs, so a small pass (few pairs per expert) stages only what it has and more CTAs fit.
inline constexpr int64_t kMoeGroupedTilePairs = 64;
// K granularity of the tiled matmuls: both hidden_size and moe_intermediate_size must be multiples.
inline constexpr int64_t kMoeGroupedKStep = 128;

// Tile shapes (MoeGroupedArgs::tile_variant): 1 = 64 pairs, 4 stages, 2 CTAs per SM; 2 = 32 pairs,
// 3 CTAs; 3 = 16 pairs, 4 CTAs; 4 = 16 pairs, 3 stages, 5 CTAs; 5 = 64 pairs and 256 weight rows
// (8 warps), 2 stages, 2 CTAs. Shapes 1-4 have 4 warps and 128 weight rows. Where shape 5 does not
// fit the device's shared memory per block it runs as 1.
inline constexpr int kMoeGroupedVariants = 5;
inline int64_t moe_grouped_variant_tile_pairs(int variant) {
  return variant == 1 || variant >= 5 ? 64 : variant == 2 ? 32 : 16;
}
// The shape the launcher uses for a pass of `pairs` over `n_experts` (measured on H200 with
// tests/bench/bench_gpu_moe_grouped.cpp; defined in moe_grouped.cu).
int moe_grouped_auto_variant(int64_t pairs, int64_t n_experts);

// Most expert tiles `pairs` pairs over `n_experts` experts can need with tiles of tile_pairs (the
// default: the narrowest shape's, enough for every shape): sum of ceil(count/tile) over the
// non-empty experts <= pairs/tile + min(pairs, n_experts).
inline int64_t moe_grouped_max_tiles(int64_t pairs, int64_t n_experts, int64_t tile_pairs = 16) {
  return pairs / std::max<int64_t>(1, tile_pairs) + std::min(pairs, n_experts);
}
// int32 scratch of the bucketing: offsets [E+1], tile count [1], tile experts / starts [T] each,
// the pairs sorted by expert [pairs].
inline int64_t moe_grouped_sort_ints(int64_t pairs, int64_t n_experts, int64_t tile_pairs = 16) {
  return n_experts + 2 + 2 * moe_grouped_max_tiles(pairs, n_experts, tile_pairs) + pairs;
}
// The shapes the tiled matmuls take (K steps of 128; the caller falls back to lin4 otherwise).
inline bool moe_grouped_supported(int64_t dim, int64_t inter) {
  return dim > 0 && inter > 0 && dim % kMoeGroupedKStep == 0 && inter % kMoeGroupedKStep == 0;
}

// The scaled path's scratch (MoeGroupedArgs::rows16): f16 rows of the larger input (x: n x dim, or
// the SwiGLU codes: pairs x inter), 16-byte aligned, then an int32 row exponent per token and per pair.
constexpr int64_t moe_grouped_rows16_info_offset(int64_t n, int64_t top_k, int64_t dim, int64_t inter) {
  return (std::max(n * dim, n * top_k * inter) * 2 + 15) / 16 * 16;
}
constexpr int64_t moe_grouped_rows16_bytes(int64_t n, int64_t top_k, int64_t dim, int64_t inter) {
  return moe_grouped_rows16_info_offset(n, top_k, dim, inter) + (n + n * top_k) * 4;
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
  // Optional scratch of moe_grouped_rows16_bytes(n, top_k, dim, inter) bytes, 16-byte aligned and
  // apart from every other buffer: the scaled path (f16 input rows that carry their block scales;
  // its numerics: block_fold below). Null: the codes path throughout.
  void* rows16 = nullptr;
  int64_t rows16_bytes = 0;
  // The scaled path's numerics. false (the default): every row gets an f16 form (a row whose block
  // scales span more than 2^12 has its smallest blocks' values rounded to f16, ScaledRowsArgs::
  // round_wide) and the MMAs sum the whole K with the weights' block scales inside their operands
  // (moe_grouped.cu, the whole-K form; warps whose weight rows do not allow it fold per block).
  // true: the 32-wide blocks folded one by one in K order, the codes path's bits (tests, bench).
  bool block_fold = false;
  // 0: the automatic tile shape; 1..kMoeGroupedVariants force one (tests, bench; see
  // moe_grouped_variant_tile_pairs). A shape whose tile list does not fit sort_ints or the grid falls
  // back to a wider one, one that does not fit the device's shared memory to a smaller one.
  int tile_variant = 0;
};

namespace raw {
cudaError_t moe_grouped(const MoeGroupedArgs& a, cudaStream_t s);
}  // namespace raw

}  // namespace dsv41::ops::gpu
