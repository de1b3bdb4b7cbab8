// f16 rows that carry their block scales (kernels/ops/scaled_rows.h). One warp per row: the largest
// and smallest scale exponents of the blocks with a nonzero code (a block of ±0 codes is zeros
// whatever its scale), c = 7 - e_max, then each block's codes times 2^(e_b + c) in f16: with e_b + c
// in [-5, 7] every nonzero |value| lies in [2^-9 · 2^-5, 448 · 2^7] = [2^-14, 57344], f16 normals,
// and e4m3's 4 significant bits fit f16's 11, so each value is exact.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"
#include "ops/scaled_rows.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
__global__ void __launch_bounds__(32 * kWarps) scaled_rows_kernel(const ScaledRowsArgs a) {
  dev::pdl_enter();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5), k = a.k;
  if (row >= a.rows) return;
  const int64_t nb = k / 32;
  const uint8_t* rc = a.codes + row * k;
  const float* rs = a.scales + row * nb;
  int e_max = -1000, e_min = 1000;
  bool bad = false;
  auto nonzero = [&](int64_t b) {
    const uint4 c0 = *reinterpret_cast<const uint4*>(rc + b * 32);
    const uint4 c1 = *reinterpret_cast<const uint4*>(rc + b * 32 + 16);
    return ((c0.x | c0.y | c0.z | c0.w | c1.x | c1.y | c1.z | c1.w) & 0x7F7F7F7Fu) != 0;  // ±0 codes are zeros
  };
  for (int64_t b = lane; b < nb; b += 32) {
    if (!nonzero(b)) continue;
    const uint32_t bits = __float_as_uint(rs[b]);
    const int ef = static_cast<int>(bits >> 23) & 0xFF;
    if ((bits & 0x807FFFFFu) != 0 || ef == 0 || ef == 255) {
      bad = true;
      continue;
    }
    e_max = max(e_max, ef - 127);
    e_min = min(e_min, ef - 127);
  }
  for (int o = 16; o > 0; o >>= 1) {
    e_max = max(e_max, __shfl_xor_sync(dev::kFull, e_max, o));
    e_min = min(e_min, __shfl_xor_sync(dev::kFull, e_min, o));
  }
  bad = __any_sync(dev::kFull, bad);
  const bool any_block = e_max >= e_min;
  const int c = any_block ? 7 - e_max : 0;
  const bool ok = !bad && c >= 0 && c <= 100 && (!any_block || e_max - e_min <= 12 || a.round_wide);
  if (lane == 0) a.info[row] = ok ? c : kScaledRowUnscaled;
  if (!ok) return;
  for (int64_t j = lane; j < k / 8; j += 32) {
    // 2^(e_b + c) as f16; a block of zero codes may have any scale: its values are ±0 under 1.
    const int ef = static_cast<int>(__float_as_uint(rs[j / 4]) >> 23) & 0xFF;
    const int s = ef - 127 + c;
    const __half m =
        s >= -5 && s <= 7 ? __ushort_as_half(static_cast<unsigned short>((s + 15) << 10)) : __float2half(1.0f);
    const __half2 m2 = __halves2half2(m, m);
    const uint2 cv = *reinterpret_cast<const uint2*>(rc + j * 8);
    // A block more than 2^12 below the row's largest (only rows formed by round_wide have nonzero
    // ones; a block of ±0 codes gives ±0 on either branch): code · 2^s in fp32 (exact), rounded.
    const bool rounded = s < -5;
    const float ms = rounded ? __uint_as_float(static_cast<uint32_t>(max(s + 127, 1)) << 23) : 1.0f;
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t pair = ((i < 2 ? cv.x : cv.y) >> (16 * (i & 1))) & 0xFFFFu;
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
      __half2 v;
      if (!rounded) {
        v = __hmul2(__half2(raw), m2);  // exact: both are f16 values, the product an f16 normal
      } else {
        const float2 f = __half22float2(__half2(raw));
        v = __floats2half2_rn(__fmul_rn(f.x, ms), __fmul_rn(f.y, ms));
      }
      h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
    *reinterpret_cast<uint4*>(a.out + row * k + j * 8) = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

}  // namespace

namespace raw {
cudaError_t scaled_rows(const ScaledRowsArgs& a, cudaStream_t s) {
  if (a.rows <= 0) return cudaSuccess;
  return launch_pdl(scaled_rows_kernel, static_cast<unsigned>((a.rows + kWarps - 1) / kWarps), 32 * kWarps, 0, s, a);
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
