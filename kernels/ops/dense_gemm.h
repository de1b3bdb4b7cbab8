// Register-tiled CUDA-core GEMM for dense LinBF16 / LinF32 calls of many activation rows (prefill
// passes: the grouped wo_a, the compressor's wkv/wgate, the index keys), kernels/ops/dense_gemm.cu.
// raw::lin_dense sends a call here when dense_gemm_takes() says so; every output is bit-identical
// to the other dense kernels (kernels/ops/lin_dense.cu) and to the CPU reference (dot.h order).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// Rows from which a dense call may run as a GEMM (below it the tiled GEMV-style kernel, which reads
// the weights once per 8 rows, keeps it); DSV41_DENSE_GEMM_MIN_ROWS overrides it at start. On the
// real shapes the fill rule (dense_gemm_takes) binds first: wo_a reaches it from 129 rows.
constexpr int64_t kDenseGemmMinRows = 64;

// Whether lin_dense hands this call to dense_gemm: m >= the minimum rows, in % 32 == 0, 16-byte
// aligned rows, and (unless a tile is forced) enough CTA tiles to fill the GPU.
bool dense_gemm_takes(const DenseArgs& a);
// The GEMM (any m >= 1; needs in % 32 == 0 and 16-byte aligned w, x rows and group offsets).
cudaError_t dense_gemm(const DenseArgs& a, cudaStream_t s);

// The tensor-core GEMM for bf16 weights (kernels/ops/dense_tc_gemm.cu): calls with
// DenseArgs::tensor_core, at least kDenseTcMinRows rows, in % 32 == 0, 16-byte aligned rows and
// group offsets, and its shared memory within the device's limit.
constexpr int64_t kDenseTcMinRows = 64;
bool dense_tc_gemm_takes(const DenseArgs& a);
cudaError_t dense_tc_gemm(const DenseArgs& a, cudaStream_t s);

// Test and benchmark hooks (process-wide). set_dense_gemm_min_rows: the dispatch threshold (a huge
// value keeps every call on the older kernels); returns the previous value.
int64_t set_dense_gemm_min_rows(int64_t m);
// CTA tile: 0 = chosen per call, 1 = 64x64, 2 = 128x128 (rows x outputs); DSV41_DENSE_GEMM_TILE
// sets it at start. A forced tile also makes dense_gemm_takes ignore the fill rule. Returns the
// previous value.
int set_dense_gemm_tile(int tile);

}  // namespace dsv41::ops::gpu::raw
