// The kernel-argument block of a Lin8 group's GEMM (up to kLinGroupMax linears over the same input
// codes, their output tiles dealt as if concatenated), shared by the CUDA-core GEMM (lin_gemm.cu)
// and the tensor-core GEMM (lin8_tc_gemm.cu); raw::fill_lin8_parts (lin_gemm.h) fills it.
#pragma once
#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {

struct Lin8GemmParts {
  static constexpr int kMaxParts = kLinGroupMax;
  int n_parts = 1;
  const uint8_t* w[kMaxParts] = {};   // codes [out][in]
  const uint8_t* ws[kMaxParts] = {};  // E8M0 [ceil(out/32)][in/32]
  int64_t out[kMaxParts] = {};
  float* y[kMaxParts] = {};
  int64_t y_stride[kMaxParts] = {};
  int64_t col0[kMaxParts] = {};  // first output tile (CTA column) of each part
  int64_t in = 0;
  const uint8_t* x_codes = nullptr;  // [rows][in]
  const float* x_scales = nullptr;   // [rows][in/32]
  // The scaled path's f16 rows [rows][in] and row exponents [rows] (ops/scaled_rows.h), or null.
  const uint16_t* x16 = nullptr;
  const int32_t* x16_info = nullptr;
  int64_t rows = 0;
  bool round_bf16 = true;
  bool block_fold = true;  // the tensor-core GEMM's scaled path: Lin8Args::block_fold
};

// Numbers the output tiles of `tile` outputs over the parts as if their outputs were concatenated
// (each part's last tile may be partial): fills col0, returns the number of tiles.
inline int64_t lin8_number_part_tiles(Lin8GemmParts& a, int64_t tile) {
  int64_t cols = 0;
  for (int p = 0; p < a.n_parts; ++p) {
    a.col0[p] = cols;
    cols += (a.out[p] + tile - 1) / tile;
  }
  return cols;
}

// The part that output tile `col` of the concatenated outputs falls in, and the tile within it.
struct Lin8PartView {
  const uint8_t* w;
  const uint8_t* ws;
  int64_t out;
  float* y;
  int64_t y_stride;
  int64_t col;  // output tile within the part
};
// Static indices keep the argument arrays in the parameter space.
__device__ __forceinline__ Lin8PartView lin8_part_of(const Lin8GemmParts& a, int64_t col) {
  Lin8PartView v{a.w[0], a.ws[0], a.out[0], a.y[0], a.y_stride[0], col};
#pragma unroll
  for (int p = 1; p < Lin8GemmParts::kMaxParts; ++p)
    if (p < a.n_parts && col >= a.col0[p]) v = {a.w[p], a.ws[p], a.out[p], a.y[p], a.y_stride[p], col - a.col0[p]};
  return v;
}

}  // namespace dsv41::ops::gpu
