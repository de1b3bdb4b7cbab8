// Row gather (the EXL3 MoE's expert-sorted rows, cuda_exl3.cpp): dst[r][c] = src[idx[r]][c] for
// r < rows, c < cols; fp32, an exact copy. A negative index gives a zero row (a pair another
// tensor-parallel rank computes). Validated entry point: dsv41/ops/gpu_ops.h gather_rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41::ops::gpu {

struct GatherRowsArgs {
  const float* src = nullptr;  // row i at src + i*src_stride
  int64_t src_rows = 0, src_stride = 0;
  const int32_t* idx = nullptr;  // [rows] device, each < src_rows (checked by the kernel: a row past
                                 // the end is written as NaN), or negative for zeros
  float* dst = nullptr;          // row r at dst + r*dst_stride
  int64_t dst_stride = 0;
  int64_t rows = 0, cols = 0;
};

namespace raw {
cudaError_t gather_rows(const GatherRowsArgs& a, cudaStream_t s);
}  // namespace raw

}  // namespace dsv41::ops::gpu
