// FP8 e4m3 code pairs to exact values with the hardware conversion (no tables): shared by the Lin8 /
// Lin4 GEMVs (lin_fp8.cu) and the prefill Lin8 GEMM (lin_gemm.cu).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv41::ops::gpu {

// Two e4m3 codes (bits 0..7 and 8..15 of v) -> f16x2 (low half first) in one cvt on sm_89+ (exact:
// every e4m3 value is an f16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
__device__ __forceinline__ float f16_lo(uint32_t h) { return __half2float(__ushort_as_half(static_cast<unsigned short>(h))); }
__device__ __forceinline__ float f16_hi(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h >> 16)));
}

}  // namespace dsv41::ops::gpu
