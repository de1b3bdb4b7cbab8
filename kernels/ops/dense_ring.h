// Dense LinBF16 / LinF16 calls of few activation rows (decode sizes: the head, wo_a) on one cp.async
// ring a warp, kernels/ops/dense_ring.cu. raw::lin_dense sends a call here
// when dense_ring_takes() says so; every output is bit-identical to the other dense kernels and to
// the CPU reference (dot.h order: fma chains over 256-wide K blocks from zero, block results added
// in K order from zero).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// Activation rows up to which the kernel takes a call (one to four chains a thread).
constexpr int64_t kDenseRingMaxRows = 4;

// Whether lin_dense hands this call to dense_ring: bf16 or fp16 weights, 1 <= m <= kDenseRingMaxRows,
// in % 8 == 0, 16-byte aligned w, x and x_stride, the rings (and a K split's block results) fit the
// device's shared memory, and (automatically) enough output rows that 32-row tiles split K at most
// four ways give a CTA of warps an SM (the head: no split; wo_a: four; fewer rows keep the tiled
// kernel's K split or the streaming kernel).
bool dense_ring_takes(const DenseArgs& a);
// The kernel (cudaErrorInvalidValue for a call it cannot take).
cudaError_t dense_ring(const DenseArgs& a, cudaStream_t s);

// Test and benchmark hook (process-wide; returns the previous value): 0 = automatic, 1 = off,
// 2 = every call the kernel can take, whatever its size (DSV41_DENSE_RING).
int set_dense_ring_mode(int mode);
// The K split, the warps that share a 32-row tile: 1, 2 or 4; 0 = chosen per call
// (DSV41_DENSE_RING_SPLIT).
int set_dense_ring_split(int p);

}  // namespace dsv41::ops::gpu::raw
