// Lin8 at decode sizes on the tensor cores (kernels/ops/lin8_tc_gemv.cu): calls of a pass whose rows
// must not depend on each other (Lin8Args::row_invariant: decode steps, DSpark drafts) and that
// allow tensor-core sums (no exact_block_sums). raw::lin8_group sends a call here when
// lin8_tc_gemv_takes() says so (bench/RESULTS.md: 21-41 % faster than the sequential kernel at four
// rows, within 9 % either way at one; decode steps 1-2 % shorter at batch 1, 5-6 % at batch 4).
//
// The numerics, which depend on nothing but the weights, K and the row itself (so a row's bits are
// the same at any batch size, in any column of a tile, and under tensor parallelism, which splits
// outputs, never K):
// - K runs in chunks of kLin8GemvChunk; a chunk's products are summed whole in the fp32 MMA
//   accumulators from zero, and the chunks' sums are added in K order in fp32.
// - The products are exact: the weight codes go into the MMAs as themselves (e4m3 is an f16 value);
//   each activation code carries its block scale, the weight block's scale relative to the largest
//   in its 32-row group over the whole K, and one power of two per row that puts the row's largest
//   block at 2^7 (code · 2^(e_x + c + s_w - s_max) in f16). Every such value is an f16 value while
//   the block lies within 2^22 of the row's and group's largest ones; a smaller block's values are
//   rounded to f16 (absolute error at most 2^-25 in units where the largest value is up to 57,344).
// - The output is the sum times 2^(s_max - 127 - c), then bf16-rounded when asked.
// Against the CPU's sequential block sums: within the bound of tests/gpu_ops/lin8_tc_gemv_test.cpp
// (the MMA steps' and the chunk sums' roundings, on top of the CPU's own).
// A row whose activation scales are not normal powers of two (ActQuant8's always are; a non-finite
// activation gives an infinite scale) or whose codes hold a NaN gets NaN outputs; a weight block
// whose scale byte is 255 (NaN) makes its group's outputs NaN, as on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// K of one chunk (its products summed whole in the MMAs).
constexpr int64_t kLin8GemvChunk = 256;
// The smallest K the kernel takes. Measured on H200 (bench_gpu_linear --decode): at K = 1280 (wq_b,
// the indexer's wq_b: 5 chunks a 16-row tile, too few segments a warp for its ring to fill) the
// sequential kernel is faster at every m (wq_b m = 1 16.3 against 24.6 us, m = 4 26.7 against
// 32.3); from K = 2304 it is within 9 % either way at m = 1 and faster at m = 4 (wo_b 30.9 -> 18.2,
// shared w2 15.7 -> 11.3). The choice depends on the shape alone, never on m.
constexpr int64_t kLin8GemvMinK = 2048;

// Whether lin8_group hands this call to lin8_tc_gemv: the kernel is on (the default; off by
// DSV41_LIN8_TC_GEMV=0, read at the first call, or by set_lin8_tc_gemv), row_invariant set,
// exact_block_sums not, kLin8GemvMinK <= K, K % 64 == 0 and at most 32 chunks, 16-byte aligned
// weight and activation codes.
bool lin8_tc_gemv_takes(const Lin8GroupArgs& g);
// Turns the kernel on (1) or off (0) for the process (tests, benchmarks); returns the previous
// setting. Off, row-invariant calls take the sequential sums.
int set_lin8_tc_gemv(int on);
// The kernel for a group of up to three Lin8s over the same input codes (any m >= 1).
cudaError_t lin8_tc_gemv(const Lin8GroupArgs& g, cudaStream_t s);

}  // namespace dsv41::ops::gpu::raw
