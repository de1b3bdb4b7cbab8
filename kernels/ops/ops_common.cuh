// Device helpers shared by the non-EXL3 op kernels (kernels/ops/*.cu): the reference's rounding
// primitives (bf16, e4m3, e2m1, E8M0) and its fp32 summation orders (MODEL.md §4).
//
// Exactness rules. nvcc contracts a*b+c into an fma by default while the CPU reference is built
// without contraction, so every product that feeds a sum is written with __fmul_rn/__fadd_rn, and
// fmaf appears only where the reference itself fuses (dot.h's 256-wide blocks). exp/log go through
// double precision and are rounded once to fp32: that reproduces the correctly rounded libm values
// the CPU reference gets, instead of the few-ulp CUDA fast forms.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "ops/smem_limit.h"

namespace dsv41::ops::gpu::dev {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kGemmKBlock = 256;  // dot.h: fma chains of 256 from zero, added in K order

__device__ __forceinline__ float bf16_round(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) { return static_cast<uint16_t>(__float_as_uint(bf16_round(f)) >> 16); }
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// The eight 16-bit weights of a 16-byte piece widened to fp32 in K order (low half first), exactly:
// bf16 storage (uint16_t) or fp16 storage (__half).
__device__ __forceinline__ void widen8(const uint4 v, float (&o)[8], const uint16_t*) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = __uint_as_float(u[i] << 16);
    o[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void widen8(const uint4 v, float (&o)[8], const __half*) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
    o[2 * i] = f.x;
    o[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float exp_ref(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
__device__ __forceinline__ float log1p_ref(float x) { return static_cast<float>(log1p(static_cast<double>(x))); }
__device__ __forceinline__ float sigmoid_ref(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_ref(-x))); }

// PyTorch's vectorised float exp (SLEEF expf u10), bit-identical to src/model/ops/vec_math.cpp
// torch_vec_exp_f32: q = rint(x/ln2), two-part ln2 reduction, degree-5 polynomial in fmas, 2^q in
// two steps.
__device__ __forceinline__ float torch_vec_exp(float x) {
  if (isnan(x)) return x;
  if (x < -104.0f) return 0.0f;
  if (x > 100.0f) return INFINITY;
  const float kInvLn2 = 1.442695040888963407359924681001892137426645954152985934135449406931f;
  const float kLn2Hi = 0.693145751953125f;
  const float kLn2Lo = 1.428606765330187045e-06f;
  const int q = __float2int_rn(__fmul_rn(x, kInvLn2));
  const float qf = static_cast<float>(q);
  float s = fmaf(qf, -kLn2Hi, x);
  s = fmaf(qf, -kLn2Lo, s);
  float p = 0.000198527617612853646278381f;
  p = fmaf(p, s, 0.00139304355252534151077271f);
  p = fmaf(p, s, 0.00833336077630519866943359f);
  p = fmaf(p, s, 0.0416664853692054748535156f);
  p = fmaf(p, s, 0.166666671633720397949219f);
  p = fmaf(p, s, 0.5f);
  const float u = __fadd_rn(1.0f, fmaf(__fmul_rn(s, s), p, s));
  const int half = q >> 1;
  const float a = __uint_as_float(static_cast<uint32_t>(half + 127) << 23);
  const float b = __uint_as_float(static_cast<uint32_t>(q - half + 127) << 23);
  return __fmul_rn(__fmul_rn(u, a), b);
}
// torch.sigmoid on one element: vector body (vectorised exp) or scalar tail (libm exp).
__device__ __forceinline__ float torch_sigmoid(float x, bool vector_path) {
  const float e = vector_path ? torch_vec_exp(-x) : exp_ref(-x);
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
}

// Nearest e4m3fn value (ties to even), saturating at ±448; NaN stays NaN (numeric.h e4m3_round).
__device__ __forceinline__ float e4m3_round(float x) {
  if (isnan(x)) return x;
  float a = fabsf(x);
  if (a >= 0.015625f) {
    uint32_t u = __float_as_uint(a);
    u = u + ((1u << 19) - 1) + ((u >> 20) & 1u);
    u &= ~((1u << 20) - 1);
    a = __uint_as_float(u);
    if (a > 448.0f) a = 448.0f;
  } else {
    a = __fdiv_rn(rintf(__fmul_rn(a, 512.0f)), 512.0f);
  }
  return signbit(x) ? -a : a;
}
// Byte of an e4m3 value that is already on the grid (as e4m3_round returns).
__device__ __forceinline__ uint8_t e4m3_bits(float r) {
  if (isnan(r)) return 0x7F;
  const float a = fabsf(r);
  uint8_t bits;
  if (a >= 0.015625f) {
    const uint32_t u = __float_as_uint(a);
    const int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 7;
    bits = static_cast<uint8_t>((e << 3) | ((u >> 20) & 7));
  } else {
    bits = static_cast<uint8_t>(__fmul_rn(a, 512.0f));
  }
  return static_cast<uint8_t>(bits | (signbit(r) ? 0x80 : 0));
}
__device__ __forceinline__ float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 0xF && m == 7) return __uint_as_float(0x7fc00000u);
  float v = e == 0 ? ldexpf(static_cast<float>(m), -9) : ldexpf(1.0f + m * 0.125f, e - 7);
  return (b & 0x80) ? -v : v;
}
// E8M0: 2^(b-127), 255 = NaN (byte 0 is the subnormal 2^-127).
__device__ __forceinline__ float e8m0_value(uint8_t b) {
  if (b == 255) return __uint_as_float(0x7fc00000u);
  if (b == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<uint32_t>(b) << 23);
}
// v · 2^e for e in [-252, 127]: one multiply by a normal power of two, or two (exact unless the
// result leaves fp32's normal range).
__device__ __forceinline__ float times_pow2(float v, int e) {
  if (e >= -126) return __fmul_rn(v, __uint_as_float(static_cast<uint32_t>(e + 127) << 23));
  return __fmul_rn(__fmul_rn(v, __uint_as_float(1u << 23)), __uint_as_float(static_cast<uint32_t>(e + 126 + 127) << 23));
}
__device__ __forceinline__ float e2m1_value(uint8_t nibble) {
  const uint8_t m = nibble & 7;
  const float v = m < 4 ? 0.5f * m : (m == 4 ? 2.0f : (m == 5 ? 3.0f : (m == 6 ? 4.0f : 6.0f)));
  return (nibble & 8) ? -v : v;
}
// quant.cpp e2m1_round: nearest of {0,.5,1,1.5,2,3,4,6}, ties to the even code.
__device__ __forceinline__ float e2m1_round(float v) {
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = fabsf(v);
  int code = 0;
#pragma unroll
  for (int i = 0; i < 7; ++i)
    if (mag > mids[i] || (mag == mids[i] && (i & 1))) ++code;
  return signbit(v) ? -grid[code] : grid[code];
}
// quant.cpp pow2_ceil_scale: next power of two >= amax*max_inv, on the bits of the product.
__device__ __forceinline__ float pow2_ceil_scale(float amax, float max_inv) {
  const uint32_t bits = __float_as_uint(__fmul_rn(amax, max_inv));
  const int32_t e = static_cast<int32_t>((bits >> 23) & 0xFF);
  const int32_t lc = e - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
  return __uint_as_float(static_cast<uint32_t>(lc + 127) << 23);
}
__device__ __forceinline__ float clampf(float v, float lo, float hi) { return fminf(fmaxf(v, lo), hi); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// torch_sum_f32 (src/model/ops/torch_sum.cpp) computed by one warp: lane k*8+l owns the reference's
// accumulator chain (ilp k, vector lane l) and walks it in the same cascade, so the result is the
// identical fp32 value. `value(i)` yields element i (already rounded as the reference rounds it).
// Every lane returns the total.
// The shape of torch_sum_f32 over n values: vec_size vectors of 8 lanes, size_ilp of them per ilp
// chain, level width 2^lp (step) of the fold cascade, and the number of full steps per chain.
struct TorchSumShape {
  int64_t vec_size, size_ilp, lp, step, groups;
};
__host__ __device__ inline TorchSumShape torch_sum_shape(int64_t n) {
  constexpr int kLanes = 8, kIlp = 4, kLevels = 4;
  TorchSumShape s;
  s.vec_size = n / kLanes;
  s.size_ilp = s.vec_size / kIlp;
  int64_t c = 0;
  if (s.size_ilp > 1) {
    uint64_t y = static_cast<uint64_t>(s.size_ilp - 1);
    while (y) ++c, y >>= 1;
  }
  s.lp = c / kLevels < 4 ? 4 : c / kLevels;
  s.step = int64_t{1} << s.lp;
  s.groups = s.size_ilp / s.step;
  return s;
}

// The end of torch_sum_f32 for one warp whose lane k*8+l holds acc[0] of chain (k, l) after the
// cascade: the leftover vectors, the ilp chains, the 8 vector lanes and the scalar tail, in the
// reference's order. Every lane returns the total.
template <class F>
__device__ __forceinline__ float torch_sum_finish(F value, int64_t n, float acc0) {
  constexpr int kLanes = 8, kIlp = 4;
  const int lane = threadIdx.x & 31, k = lane / kLanes, l = lane % kLanes;
  const int64_t vec_size = n / kLanes, size_ilp = vec_size / kIlp;
  if (k == 0)
    for (int64_t v = size_ilp * kIlp; v < vec_size; ++v) acc0 = __fadd_rn(acc0, value(v * kLanes + l));
  // acc[0][0][l] += acc[0][k][l] for k = 1..3 in order
  const float a1 = __shfl_sync(kFull, acc0, (lane + 8) & 31);
  const float a2 = __shfl_sync(kFull, acc0, (lane + 16) & 31);
  const float a3 = __shfl_sync(kFull, acc0, (lane + 24) & 31);
  float lane_sum = __fadd_rn(__fadd_rn(__fadd_rn(acc0, a1), a2), a3);  // valid in lanes 0..7
  float total = 0.0f;
  for (int64_t t = vec_size * kLanes; t < n; ++t) total = __fadd_rn(total, value(t));
#pragma unroll
  for (int j = 0; j < kLanes; ++j) total = __fadd_rn(total, __shfl_sync(kFull, lane_sum, j));
  return total;
}

template <class F>
__device__ float warp_torch_sum(F value, int64_t n) {
  constexpr int kLanes = 8, kIlp = 4, kLevels = 4;
  const int lane = threadIdx.x & 31, k = lane / kLanes, l = lane % kLanes;
  const int64_t vec_size = n / kLanes, size_ilp = vec_size / kIlp;
  int64_t lp = 0;
  {
    int64_t x = size_ilp, c = 0;
    if (x > 1) {
      uint64_t y = static_cast<uint64_t>(x - 1);
      while (y) ++c, y >>= 1;
    }
    lp = c / kLevels < 4 ? 4 : c / kLevels;
  }
  const int64_t step = int64_t{1} << lp, mask = step - 1;
  float acc[kLevels] = {0.0f, 0.0f, 0.0f, 0.0f};
  // The chain is walked in batches of 16 (step is a multiple of 16: lp >= 4): the batch's values
  // are fetched first, so their loads overlap, then added one by one in the same order.
  constexpr int kBatch = 16;
  auto add_batch = [&](int64_t i0) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = value(((i0 + u) * kIlp + k) * kLanes + l);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) acc[0] = __fadd_rn(acc[0], v[u]);
  };
  int64_t i = 0;
  while (i + step <= size_ilp) {
    for (int64_t j = 0; j < step; j += kBatch, i += kBatch) add_batch(i);
#pragma unroll
    for (int lev = 1; lev < kLevels; ++lev) {
      acc[lev] = __fadd_rn(acc[lev], acc[lev - 1]);
      acc[lev - 1] = 0.0f;
      if ((i & (mask << (lev * lp))) != 0) break;
    }
  }
  for (; i + kBatch <= size_ilp; i += kBatch) add_batch(i);
  for (; i < size_ilp; ++i) acc[0] = __fadd_rn(acc[0], value((i * kIlp + k) * kLanes + l));
#pragma unroll
  for (int lev = 1; lev < kLevels; ++lev) acc[0] = __fadd_rn(acc[0], acc[lev]);
  return torch_sum_finish(value, n, acc[0]);
}

// torch_sum_f32 split over several warps. In warp_torch_sum every full step of a chain is summed
// from zero (acc[0] is reset when it is folded into acc[1]), and so is the chain's tail, so those
// partial sums can be formed by different warps at once; one warp then replays the fold cascade
// over them and the final combination. The result is bit-identical to warp_torch_sum.
// Scratch: torch_sum_scratch_floats(n) floats of shared memory (n/16 and a little).
__host__ __device__ inline int64_t torch_sum_scratch_floats(int64_t n) { return 32 * (torch_sum_shape(n).groups + 1); }

// Warp w of nw: the partial sums of steps w, w+nw, ... (step `groups` = the tail) of all 32 chains
// (lane = chain), into scratch[step*32 + lane].
template <class F>
__device__ void torch_sum_partials(F value, int64_t n, int w, int nw, float* scratch) {
  const TorchSumShape s = torch_sum_shape(n);
  const int lane = threadIdx.x & 31;
  for (int64_t g = w; g <= s.groups; g += nw) {
    const int64_t i0 = g * s.step, i1 = i0 + s.step < s.size_ilp ? i0 + s.step : s.size_ilp;
    float acc = 0.0f;
    int64_t i = i0;
    for (; i + 16 <= i1; i += 16) {
      float v[16];
#pragma unroll
      for (int u = 0; u < 16; ++u) v[u] = value((i + u) * 32 + lane);  // chain element i: (i*4 + k)*8 + l
#pragma unroll
      for (int u = 0; u < 16; ++u) acc = __fadd_rn(acc, v[u]);
    }
    for (; i < i1; ++i) acc = __fadd_rn(acc, value(i * 32 + lane));
    scratch[g * 32 + lane] = acc;
  }
}

// The cascade's three levels over the step partials, in torch's fold order: step g's partial joins
// level 1, and a level passes its sum up (and restarts) when the chain position after the step is a
// multiple of that level's span.
struct TorchCascade {
  float acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
  __device__ __forceinline__ void add(const TorchSumShape& s, int64_t g, float partial) {
    const int64_t mask = s.step - 1;
    const int64_t i = (g + 1) * s.step;  // the chain position after step g
    acc1 = __fadd_rn(acc1, partial);
    if ((i & (mask << s.lp)) != 0) return;
    acc2 = __fadd_rn(acc2, acc1);
    acc1 = 0.0f;
    if ((i & (mask << (2 * s.lp))) != 0) return;
    acc3 = __fadd_rn(acc3, acc2);
    acc2 = 0.0f;
  }
  // The tail's partial (zero when there is none) with the levels added from the lowest.
  __device__ __forceinline__ float total(float tail) const {
    float acc0 = __fadd_rn(tail, acc1);
    acc0 = __fadd_rn(acc0, acc2);
    return __fadd_rn(acc0, acc3);
  }
};

// One warp, after the partials are visible: the cascade and the end. Every lane returns the total.
template <class F>
__device__ float torch_sum_cascade(F value, int64_t n, const float* scratch) {
  const TorchSumShape s = torch_sum_shape(n);
  const int lane = threadIdx.x & 31;
  TorchCascade c;
  for (int64_t g = 0; g < s.groups; ++g) c.add(s, g, scratch[g * 32 + lane]);
  return torch_sum_finish(value, n, c.total(scratch[s.groups * 32 + lane]));
}

// torch_sum_f32 by the whole block (blockDim.x a multiple of 32): every thread calls it and gets
// the total. scratch: torch_sum_scratch_floats(n) floats, result: one float, both shared memory.
template <class F>
__device__ float block_torch_sum(F value, int64_t n, float* scratch, float* result) {
  const int warp = threadIdx.x / 32;
  torch_sum_partials(value, n, warp, static_cast<int>(blockDim.x / 32), scratch);
  __syncthreads();
  if (warp == 0) {
    const float t = torch_sum_cascade(value, n, scratch);
    if (threadIdx.x == 0) *result = t;
  }
  __syncthreads();
  return *result;
}

// gemm_dot_f32 (dot.h) for one 256-wide K block: the sequential fma chain from zero.
template <class A, class B>
__device__ __forceinline__ float dot_block(A a, B b, int64_t k0, int64_t k1) {
  float acc = 0.0f;
  for (int64_t k = k0; k < k1; ++k) acc = fmaf(a(k), b(k), acc);
  return acc;
}

// gemm_dot_f32 computed by one warp: lane j takes K blocks j, j+32, ...; the block results are
// then added in K order (lane 0's view is broadcast). Every lane returns the total.
template <class A, class B>
__device__ float warp_gemm_dot(A a, B b, int64_t n) {
  const int lane = threadIdx.x & 31;
  const int64_t nb = (n + kGemmKBlock - 1) / kGemmKBlock;
  float total = 0.0f;
  for (int64_t base = 0; base < nb; base += 32) {
    const int64_t blk = base + lane;
    float part = 0.0f;
    if (blk < nb) {
      const int64_t k0 = blk * kGemmKBlock, k1 = k0 + kGemmKBlock < n ? k0 + kGemmKBlock : n;
      part = dot_block(a, b, k0, k1);
    }
    const int64_t cnt = nb - base < 32 ? nb - base : 32;
    for (int j = 0; j < cnt; ++j) total = __fadd_rn(total, __shfl_sync(kFull, part, j));
  }
  return total;
}

// ---- staging rows in shared memory --------------------------------------------------------------
// A serial chain that fetches one global value per step waits a memory latency per step; the
// latency-bound kernels therefore copy their rows into shared memory with the whole block first
// (coalesced, several 16-byte loads in flight per thread) and run the same chains from there.

// Shared-memory layout for rows that many threads read as parallel 256-long K blocks (dot_block
// chains, thread s walking block s): element i of block s = i/256 sits in 16-byte chunk
// ((i/4) % 64) ^ (s % 8) of that block's 1 KB. The 8 threads of a quarter warp reading blocks
// s..s+7 at the same offset as float4 then hit 8 different bank groups, and a staged copy of
// consecutive chunks stays conflict-free. A row of n values takes chain_rows_size(n) floats.
__device__ __forceinline__ int64_t chain_swizzle(int64_t i) {
  const int64_t s = i >> 8;
  return (s << 8) + (((((i >> 2) & 63) ^ (s & 7))) << 2) + (i & 3);
}
__device__ __forceinline__ int64_t chain_rows_size(int64_t n) { return (n + 255) / 256 * 256; }

// dst[c][map(i)] = src[c][i] for i < n and each of the C rows, by all threads of the block, with
// map(i) = i or chain_swizzle(i) (which keeps 4-element groups contiguous and 16-byte aligned).
// 16-byte accesses when every pointer is 16-byte aligned (the tail and unaligned rows go element
// by element). The caller synchronises the block afterwards.
template <int C, bool kSwizzle>
__device__ __forceinline__ void block_stage_mapped(float* const (&dst)[C], const float* const (&src)[C], int64_t n) {
  auto at = [](int64_t i) { return kSwizzle ? chain_swizzle(i) : i; };
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  uintptr_t bits = 0;
#pragma unroll
  for (int c = 0; c < C; ++c) bits |= reinterpret_cast<uintptr_t>(dst[c]) | reinterpret_cast<uintptr_t>(src[c]);
  constexpr int kBatch = C <= 2 ? 8 : 4;
  int64_t done = 0;
  if ((bits & 15) == 0) {
    const int64_t n4 = n >> 2;
    for (int64_t base = tid; base < n4; base += kBatch * nt) {
      float4 r[C][kBatch];
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
          if (base + u * nt < n4) r[c][u] = reinterpret_cast<const float4*>(src[c])[base + u * nt];
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
          if (base + u * nt < n4) *reinterpret_cast<float4*>(dst[c] + at((base + u * nt) << 2)) = r[c][u];
    }
    done = n4 << 2;
  }
  for (int64_t base = done + tid; base < n; base += kBatch * nt) {
    float r[C][kBatch];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (base + u * nt < n) r[c][u] = src[c][base + u * nt];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (base + u * nt < n) dst[c][at(base + u * nt)] = r[c][u];
  }
}

// Rows copied as they are.
template <int C>
__device__ __forceinline__ void block_stage(float* const (&dst)[C], const float* const (&src)[C], int64_t n) {
  block_stage_mapped<C, false>(dst, src, n);
}

// Rows copied into the chain_swizzle layout (dst rows hold chain_rows_size(n) floats).
template <int C>
__device__ __forceinline__ void block_stage_swizzled(float* const (&dst)[C], const float* const (&src)[C], int64_t n) {
  block_stage_mapped<C, true>(dst, src, n);
}

// dot_block over elements [k0, k1) of two rows in the chain_swizzle layout: the same sequential
// fma chain from zero, a*b in element order; k0 must be a multiple of 4.
__device__ __forceinline__ float swizzled_chain_dot(const float* a, const float* b, int64_t k0, int64_t k1) {
  float acc = 0.0f;
  int64_t j = k0;
#pragma unroll 4
  for (; j + 4 <= k1; j += 4) {
    const int64_t p = chain_swizzle(j);
    const float4 x = *reinterpret_cast<const float4*>(a + p), y = *reinterpret_cast<const float4*>(b + p);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
    acc = fmaf(x.z, y.z, acc);
    acc = fmaf(x.w, y.w, acc);
  }
  for (; j < k1; ++j) acc = fmaf(a[chain_swizzle(j)], b[chain_swizzle(j)], acc);
  return acc;
}

// Adds v[0..n) one by one in index order onto `total` (values in shared memory, fetched in
// batches so the loads overlap).
__device__ __forceinline__ float ordered_sum(float total, const float* v, int64_t n) {
  constexpr int kBatch = 16;
  int64_t i = 0;
  for (; i + kBatch <= n; i += kBatch) {
    float r[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) r[u] = v[i + u];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) total = __fadd_rn(total, r[u]);
  }
  for (; i < n; ++i) total = __fadd_rn(total, v[i]);
  return total;
}

}  // namespace dsv41::ops::gpu::dev

namespace dsv41::ops::gpu {

// Raises a kernel's dynamic shared-memory limit to `bytes` (near or above the default 48 KB, which
// bounds static and dynamic shared memory together), once per device and size, through
// raise_dynamic_smem (ops/smem_limit.h: refused when the device's limit is smaller; safe inside a
// graph capture).
template <auto Kernel>
inline cudaError_t allow_dynamic_smem(size_t bytes) {
  if (bytes <= 32 * 1024) return cudaSuccess;  // the default 48 KB covers it with the static part
  static size_t configured[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev >= 0 && dev < 64 && configured[dev] >= bytes) return cudaSuccess;
  e = raise_dynamic_smem(Kernel, bytes);
  if (e == cudaSuccess && dev >= 0 && dev < 64) configured[dev] = bytes;
  return e;
}

// An attribute of the current device, or `fallback` (the H200's value) when it cannot be read.
inline int device_attribute(cudaDeviceAttr attr, int fallback) {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, attr, dev) != cudaSuccess || n <= 0)
    return fallback;
  return n;
}
// SMs of the current device.
inline int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount, 132); }
// Bytes of the current device's L2 cache.
inline int64_t l2_bytes() { return device_attribute(cudaDevAttrL2CacheSize, 50 << 20); }

// Opt-in to more than 48 KB of dynamic shared memory with the largest shared-memory carveout, once
// per kernel and device (`done`: that kernel's bit per device; the attribute is per device, and
// tensor-parallel processes drive several).
template <class K>
inline cudaError_t allow_smem(K kernel, size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;
  e = raise_dynamic_smem(kernel, bytes);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

// Largest dynamic shared memory the staged (latency) kernels ask for; rows that need more, or more
// than the device gives a block (GB10: 99 KB), take the kernels' unstaged forms.
inline constexpr size_t kMaxStagedSmem = 200 * 1024;
template <auto Kernel>
inline bool staged_smem_fits(size_t bytes) {
  return bytes <= kMaxStagedSmem && (bytes <= 32 * 1024 || smem_fits(Kernel, bytes));
}

}  // namespace dsv41::ops::gpu
