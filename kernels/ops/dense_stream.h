// Weight-streaming kernel for dense LinBF16 / LinF32 calls of few activation rows (decode steps:
// the compressor's fp32 wkv/wgate, the index keys, weights_proj), kernels/ops/dense_stream.cu.
// raw::lin_dense sends a call here when dense_stream_takes() says so (automatically: m <= 4 and one
// wave of CTAs holds the whole call; wo_a and the head keep the older tiled kernel); every output is
// bit-identical to the other dense kernels and to the CPU reference (dot.h order).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// Activation rows up to which lin_dense takes the streaming kernel on its own (decode batches).
constexpr int64_t kDenseStreamMaxRows = 4;

// How one call runs: tiles of `rows_per_tile` weight rows (all of K) for up to `act_rows`
// activation rows; `ctas` CTAs of `threads` threads each walk a contiguous range of tiles with
// `stages` tiles in flight; `smem` bytes of dynamic shared memory per CTA.
struct DenseStreamPlan {
  int rows_per_tile = 0, stages = 0, act_rows = 0, threads = 0;
  int64_t tiles = 0, ctas = 0;
  size_t smem = 0;
};

// The plan for a call on the current device: automatically one tile per CTA with every CTA resident
// at once (false when no such plan exists); with forced settings below, those settings where they
// fit the shared memory. False as well when the call's shape or alignment does not suit the kernel
// (in % 8 for bf16 or % 4 for fp32 weights, 16-byte aligned w, x and x_stride).
bool dense_stream_plan(const DenseArgs& a, DenseStreamPlan* plan);
// Whether lin_dense hands this call to dense_stream: m <= kDenseStreamMaxRows (any m when forced
// on) and a plan exists.
bool dense_stream_takes(const DenseArgs& a);
// The kernel (any m >= 1; cudaErrorInvalidValue when no plan exists).
cudaError_t dense_stream(const DenseArgs& a, cudaStream_t s);

// Test and benchmark hooks (process-wide; each returns the previous value). Mode: 0 = automatic,
// 1 = off (lin_dense keeps its other kernels), 2 = every call the kernel can take, any m
// (DSV41_DENSE_STREAM). Rows per tile, stages and CTAs per SM: 0 = chosen per call.
int set_dense_stream_mode(int mode);
int set_dense_stream_rows_per_tile(int rows);
int set_dense_stream_stages(int stages);
int set_dense_stream_ctas_per_sm(int ctas);

}  // namespace dsv41::ops::gpu::raw
