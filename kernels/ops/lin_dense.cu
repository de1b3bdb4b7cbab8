// LinBF16 / LinF32 (MODEL.md §4) with the CPU reference's accumulation order (dot.h: fma chains over
// 256-wide K blocks, block results added in K order): one warp per output row, lane j runs block j.
// Bit-identical to the reference; the grouped form serves the low-rank output projection wo_a.
#include <cuda_bf16.h>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;

template <class W>
__device__ __forceinline__ float wval(const W* w, int64_t k);
template <>
__device__ __forceinline__ float wval<uint16_t>(const uint16_t* w, int64_t k) { return dev::bf16_bits_to_f32(w[k]); }
template <>
__device__ __forceinline__ float wval<float>(const float* w, int64_t k) { return w[k]; }

// Eight weights starting at w + k as floats (16-byte loads for bf16, two for fp32; k % 8 == 0).
__device__ __forceinline__ void load8(const uint16_t* w, int64_t k, float (&o)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(w + k);
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = __uint_as_float(u[i] << 16);
    o[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void load8(const float* w, int64_t k, float (&o)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(w + k);
  const float4 b = *reinterpret_cast<const float4*>(w + k + 4);
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

// Lane j owns K block j (+32, ...) and runs one fma chain per activation row over it; the weights
// are read once for all rows (vector loads when Vec: in % 8 == 0 and aligned rows).
template <class W, bool Vec>
__global__ void dense_kernel(DenseArgs a) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= a.out) return;
  const int lane = threadIdx.x & 31;
  const int64_t g = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int nr = static_cast<int>(a.m - r0 < kRows ? a.m - r0 : kRows);
  const W* wrow = static_cast<const W*>(a.w) + (g * a.out + o) * a.in;
  const float* x = a.x + r0 * a.x_stride + g * a.in;
  const int64_t nb = (a.in + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t base = 0; base < nb; base += 32) {
    const int64_t kb = base + lane;
    const int cnt = static_cast<int>(nb - base < 32 ? nb - base : 32);
    float part[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (kb < nb) {
      const int64_t k0 = kb * dev::kGemmKBlock;
      const int64_t k1 = k0 + dev::kGemmKBlock < a.in ? k0 + dev::kGemmKBlock : a.in;
      int64_t k = k0;
      if constexpr (Vec) {
        for (; k + 8 <= k1; k += 8) {
          float wv[8];
          load8(wrow, k, wv);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r < nr) {
              const float* xr = x + r * a.x_stride + k;
              const float4 x0 = *reinterpret_cast<const float4*>(xr);
              const float4 x1 = *reinterpret_cast<const float4*>(xr + 4);
              const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
              for (int i = 0; i < 8; ++i) part[r] = fmaf(xv[i], wv[i], part[r]);
            }
          }
        }
      }
      for (; k < k1; ++k) {
        const float wv = wval(wrow, k);
        for (int r = 0; r < nr; ++r) part[r] = fmaf(x[r * a.x_stride + k], wv, part[r]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      if (r < nr)
        for (int j = 0; j < cnt; ++j) acc[r] = __fadd_rn(acc[r], __shfl_sync(dev::kFull, part[r], j));
  }
  if (lane < nr) {
    float v = acc[0];
    for (int r = 1; r < kRows; ++r)
      if (lane == r) v = acc[r];
    a.y[(r0 + lane) * a.y_stride + g * a.out + o] = a.round_bf16 ? dev::bf16_round(v) : v;
  }
}

}  // namespace

namespace raw {
cudaError_t lin_dense(const DenseArgs& a, cudaStream_t s) {
  if (a.m == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((a.out + kWarps - 1) / kWarps), static_cast<unsigned>((a.m + kRows - 1) / kRows),
                  static_cast<unsigned>(a.groups));
  // vector loads need 16-byte aligned weight rows and x rows/groups
  const bool vec = a.in % 8 == 0 && a.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
  if (a.wt == DenseType::BF16) {
    if (vec) dense_kernel<uint16_t, true><<<grid, kWarps * 32, 0, s>>>(a);
    else dense_kernel<uint16_t, false><<<grid, kWarps * 32, 0, s>>>(a);
  } else {
    if (vec) dense_kernel<float, true><<<grid, kWarps * 32, 0, s>>>(a);
    else dense_kernel<float, false><<<grid, kWarps * 32, 0, s>>>(a);
  }
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
