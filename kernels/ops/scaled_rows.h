// f16 rows that carry their ActQuant8 block scales (kernels/ops/scaled_rows.cu), the B operand of
// the tensor-core GEMMs' scaled path (the grouped MoE, the Lin8 GEMM). Row r of k codes (an fp32
// scale per 32) becomes out[r][i] = code · 2^(e_b + c_r) in f16, e_b the exponent of block b's
// scale and c_r one power of two per row, chosen so that every value is an f16 normal and therefore
// exact: the row's blocks with a nonzero code need scales that are normal powers of two (ActQuant8's
// always are) within 2^12 of each other. info[r] = c_r (0..100), or kScaledRowUnscaled when the row
// has no such form (its values are then not written; a GEMM takes its codes instead).
//
// Why: with x_scale inside the operand, a block's tensor-core sum comes out as part·x_scale·2^c
// exactly, so the reference's fold acc + (part·x_scale)·w_scale is one fma with w_scale, and the
// accumulator is 2^c times the reference's after every step (power-of-two scaling commutes with
// every rounding outside fp32's subnormal range); the GEMM divides by 2^c at the end.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41::ops::gpu {

inline constexpr int32_t kScaledRowUnscaled = INT32_MIN;

struct ScaledRowsArgs {
  const uint8_t* codes = nullptr;  // [rows][k] e4m3, 16-byte aligned
  const float* scales = nullptr;   // [rows][k/32]
  int64_t rows = 0, k = 0;         // k % 32 == 0
  uint16_t* out = nullptr;         // [rows][k] f16 bits, 16-byte aligned
  int32_t* info = nullptr;         // [rows]
  // Rows whose blocks span more than 2^12 get a form too: c from the largest block as always, and
  // the values of blocks more than 2^12 below it rounded to f16 (subnormal or zero: each off by at
  // most 2^-25, against values up to 57344), instead of being left to the codes. Rows with a scale
  // that is not a normal power of two, or c outside 0..100, still have none.
  bool round_wide = false;
};

namespace raw {
cudaError_t scaled_rows(const ScaledRowsArgs& a, cudaStream_t s);
}  // namespace raw

}  // namespace dsv41::ops::gpu
