// GEMMs for Lin8 calls of many rows (prefill passes). raw::lin8_group sends a call here when
// lin8_gemm_takes() says so. Calls with exact_block_sums take the register-tiled CUDA-core GEMM
// (kernels/ops/lin_gemm.cu): every output bit-identical to the GEMV kernel (kernels/ops/lin_fp8.cu)
// and to the CPU reference's Lin8. Other calls of at least kLin8TcMinRows rows take the tensor-core
// GEMM (kernels/ops/lin8_tc_gemm.cu; block sums in the tensor core, ops/tc_block.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// Rows from which a Lin8 call may run as a GEMM (measured on H200: below it the GEMV kernel, which
// reads the weights once per 4 rows, is faster on every real shape); from it the GEMM is taken where
// its time model beats the GEMV kernel's. DSV41_LIN8_GEMM_MIN_ROWS overrides it at start.
constexpr int64_t kLin8GemmMinRows = 32;

// Rows from which a call that allows tensor-core block sums (!exact_block_sums) takes the
// tensor-core GEMM. Measured on H200 (bench_gpu_linear --gemm, 32 / 64 / 256 / 1024 rows): from 64
// rows it beats the sequential kernels on every real Lin8 shape but wkv alone (512 x 5120: 40 K
// stages over 8-16 CTAs; 63 against 24 µs at 64 rows, faster from 256), which the model always runs
// grouped with wq_a; at 32 rows wq_a (1280 x 5120) alone is slower too (56 against 36 µs).
// DSV41_LIN8_TC_MIN_ROWS overrides it at start (a huge value keeps such calls on the paths of
// exact_block_sums calls).
constexpr int64_t kLin8TcMinRows = 64;

// Whether lin8_group hands this call to lin8_gemm: the tensor-core GEMM takes every call it can
// run (no exact_block_sums, m >= its threshold, in % 32 == 0, 16-byte aligned codes); the CUDA-core
// GEMM needs m >= its minimum rows, 16-byte aligned codes and (unless a tile is forced) a shorter
// modelled time than the GEMV kernel's.
bool lin8_gemm_takes(const Lin8GroupArgs& g);
// The GEMM for a group of up to kLinGroupMax Lin8s over the same input codes (any m >= 1).
cudaError_t lin8_gemm(const Lin8GroupArgs& g, cudaStream_t s);

// A Lin8 group's parts (weights, scales, outputs) and shared input, copied into a kernel's argument
// struct: the GEMM's and the GEMV kernel's (kernels/ops/lin_fp8.cu) hold these fields alike.
template <class KernelArgs>
void fill_lin8_parts(KernelArgs& k, const Lin8GroupArgs& g, int max_parts) {
  const Lin8Args& l = g.lin[0];
  k.n_parts = g.count < max_parts ? g.count : max_parts;
  for (int p = 0; p < k.n_parts; ++p) {
    k.w[p] = g.lin[p].w.codes;
    k.ws[p] = g.lin[p].w.scales;
    k.out[p] = g.lin[p].w.out;
    k.y[p] = g.lin[p].y;
    k.y_stride[p] = g.lin[p].y_stride;
  }
  k.in = l.w.in;
  k.x_codes = l.x_codes;
  k.x_scales = l.x_scales;
  k.rows = l.m;
  k.round_bf16 = l.round_bf16;
}

// Test and benchmark hooks (process-wide). set_lin8_gemm_min_rows: the dispatch threshold (a huge
// value keeps every call on the GEMV kernel); returns the previous value.
int64_t set_lin8_gemm_min_rows(int64_t m);
// CTA tile of lin8_gemm (rows x outputs): 0 = chosen per call by the time model (and then
// lin8_gemm_takes also weighs the GEMV kernel), 1 = 64x64, 2 = 128x64, 3 = 128x128, 4 = 64x64 with K
// split over 4 warp groups, 5 = 32x64 with K split over 8; DSV41_LIN8_GEMM_TILE sets it at start.
// Returns the previous value.
int set_lin8_gemm_tile(int tile);
// Whether lin8_gemm tile `tile` (1..5 as above) fits the device's shared memory (GB10: not 4 and 5);
// a forced tile that does not returns cudaErrorInvalidValue.
bool lin8_gemm_tile_fits(int tile);
// The tensor-core GEMM's dispatch threshold (rows) and CTA tile (0 = the time model's choice,
// 1..raw::kLin8TcTiles as ops/lin8_tc_gemm.h lists them; DSV41_LIN8_TC_TILE sets it at start); each
// returns the previous value.
int64_t set_lin8_tc_min_rows(int64_t m);
int set_lin8_tc_tile(int tile);

}  // namespace dsv41::ops::gpu::raw
