// Lin8 / Lin4 (MODEL.md §4): the activation arrives quantised (ActQuant8 codes + scales); each
// 32-wide K block's code dot is summed sequentially in fp32 (products of e4m3 x e4m3/e2m1 codes are
// exact), scaled by act_scale·w_scale and added in increasing K order — the CPU reference's order,
// so outputs are bit-identical. One warp per output row; lane j owns K blocks j, j+32, ...; the
// block terms are added in order through warp shuffles. Up to kRows activation rows share each
// weight read.
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;

__device__ __forceinline__ void load32(const uint8_t* p, uint8_t (&b)[32]) {
  const uint4 v0 = *reinterpret_cast<const uint4*>(p);
  const uint4 v1 = *reinterpret_cast<const uint4*>(p + 16);
  memcpy(b, &v0, 16);
  memcpy(b + 16, &v1, 16);
}

__device__ __forceinline__ void fill_lut(float* lut) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = dev::e4m3_value(static_cast<uint8_t>(i));
  __syncthreads();
}

// Adds the 32 lanes' block terms t (block base+lane) in lane order into acc.
__device__ __forceinline__ float ordered_add(float acc, float t, int cnt) {
  for (int j = 0; j < cnt; ++j) acc = __fadd_rn(acc, __shfl_sync(dev::kFull, t, j));
  return acc;
}

__global__ void lin8_kernel(Lin8Args a) {
  __shared__ float lut[256];
  fill_lut(lut);
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= a.w.out) return;
  const int lane = threadIdx.x & 31;
  const int64_t in = a.w.in, nb = in / 32, snb = (in + 31) / 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int nr = static_cast<int>(a.m - r0 < kRows ? a.m - r0 : kRows);
  const uint8_t* wrow = a.w.codes + o * in;
  const uint8_t* wsc = a.w.scales + (o / 32) * snb;
  float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t base = 0; base < nb; base += 32) {
    const int64_t kb = base + lane;
    const int cnt = static_cast<int>(nb - base < 32 ? nb - base : 32);
    float term[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (kb < nb) {
      uint8_t wb[32];
      load32(wrow + kb * 32, wb);
      const float ws = dev::e8m0_value(wsc[kb]);
      for (int r = 0; r < nr; ++r) {
        uint8_t xb[32];
        load32(a.x_codes + (r0 + r) * in + kb * 32, xb);
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) part = __fadd_rn(part, __fmul_rn(lut[xb[i]], lut[wb[i]]));
        term[r] = __fmul_rn(__fmul_rn(part, a.x_scales[(r0 + r) * nb + kb]), ws);
      }
    }
    for (int r = 0; r < kRows; ++r)
      if (r < nr) acc[r] = ordered_add(acc[r], term[r], cnt);
  }
  if (lane < nr) {
    float v = acc[0];
    for (int r = 1; r < kRows; ++r)
      if (lane == r) v = acc[r];
    a.y[(r0 + lane) * a.y_stride + o] = a.round_bf16 ? dev::bf16_round(v) : v;
  }
}

// grid.x: output row tiles; grid.y: rows (pairs).
__global__ void lin4_kernel(Lin4Args a, int64_t row_base) {
  __shared__ float lut[256];
  fill_lut(lut);
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= a.w.out) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = row_base + blockIdx.y;
  const int64_t e = a.expert_ids ? a.expert_ids[row] : 0;
  float* y = a.y + row * a.y_stride + o;
  if (e < 0 || e >= a.w.n_experts) {
    if (lane == 0) *y = 0.0f;
    return;
  }
  const int64_t in = a.w.in, nb = in / 32, xr = row / a.x_row_div;
  const uint8_t* wrow = a.w.packed + (e * a.w.out + o) * (in / 2);
  const uint8_t* wsc = a.w.scales + (e * a.w.out + o) * nb;
  const uint8_t* xc = a.x_codes + xr * in;
  const float* xs = a.x_scales + xr * nb;
  float acc = 0.0f;
  for (int64_t base = 0; base < nb; base += 32) {
    const int64_t kb = base + lane;
    const int cnt = static_cast<int>(nb - base < 32 ? nb - base : 32);
    float term = 0.0f;
    if (kb < nb) {
      const uint4 wv = *reinterpret_cast<const uint4*>(wrow + kb * 16);
      uint8_t wb[16];
      memcpy(wb, &wv, 16);
      uint8_t xb[32];
      load32(xc + kb * 32, xb);
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        part = __fadd_rn(part, __fmul_rn(lut[xb[2 * i]], dev::e2m1_value(wb[i] & 0xF)));
        part = __fadd_rn(part, __fmul_rn(lut[xb[2 * i + 1]], dev::e2m1_value(wb[i] >> 4)));
      }
      term = __fmul_rn(__fmul_rn(part, xs[kb]), dev::e8m0_value(wsc[kb]));
    }
    acc = ordered_add(acc, term, cnt);
  }
  if (lane == 0) *y = a.round_bf16 ? dev::bf16_round(acc) : acc;
}

}  // namespace

namespace raw {
cudaError_t lin8(const Lin8Args& a, cudaStream_t s) {
  if (a.m == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((a.w.out + kWarps - 1) / kWarps), static_cast<unsigned>((a.m + kRows - 1) / kRows));
  lin8_kernel<<<grid, kWarps * 32, 0, s>>>(a);
  return cudaGetLastError();
}
cudaError_t lin4(const Lin4Args& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  // grid.y is limited to 65535: long row lists run in slices
  for (int64_t r0 = 0; r0 < a.rows; r0 += 65535) {
    const int64_t nr = a.rows - r0 < 65535 ? a.rows - r0 : 65535;
    const dim3 grid(static_cast<unsigned>((a.w.out + kWarps - 1) / kWarps), static_cast<unsigned>(nr));
    lin4_kernel<<<grid, kWarps * 32, 0, s>>>(a, r0);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
