// Sequential fma chains over rows staged in shared memory in the chain_swizzle layout
// (ops_common.cuh), with 32-bit offsets: the order of dev::swizzled_chain_dot (acc = fmaf(a[j],
// b[j], acc) from zero, whole four-element steps, then the last k1 - k0 mod 4 elements one by one)
// without its per-step cost. swizzled_chain_dot forms every step's swizzled address in 64-bit
// arithmetic and checks the bound with a 64-bit compare and branch (~10 integer instructions per
// four fmas); here a whole 256-element block is unrolled, so every load is one LDS.128 at a register
// plus an immediate offset, issued kChainAhead steps before its fmas.
// Used by the mHC mix's chains (mhc.cu: 10.7 -> 9.4 us per mix call at m = 1 against the former
// loop) and the router scores at decode sizes (moe.cu).
#pragma once
#include "ops/cp_async.cuh"
#include "ops/ops_common.cuh"

namespace dsv41::ops::gpu::dev {

// chain_swizzle with 32-bit arithmetic (a staged row fits shared memory).
__device__ __forceinline__ int chain_swizzle_i32(int i) {
  const int s = i >> 8;
  return (s << 8) + ((((i >> 2) & 63) ^ (s & 7)) << 2) + (i & 3);
}

__device__ __forceinline__ float chain_fma4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// Steps whose loads are issued ahead of their fmas (a shared-memory load takes ~30 cycles, a step's
// four dependent fmas 16).
constexpr int kStagedChainAhead = 6;

// All 64 four-element steps of 256-element block s, continuing from acc. Block s holds step q in
// 16-byte chunk q ^ (s & 7): one of eight per-thread chunk values plus the compile-time 8 * (q / 8).
// kAGlobal: row a is not staged but read in place (global memory, plain layout, 16-byte aligned),
// where shared memory holds only row b (GB10: mhc.cu); the same fmas in the same order.
template <bool kAGlobal = false>
__device__ __forceinline__ float staged_chain_block(const float* a, const float* b, int s, float acc) {
  const float4* a4 = reinterpret_cast<const float4*>(a) + (s << 6);
  const float4* b4 = reinterpret_cast<const float4*>(b) + (s << 6);
  const int x = s & 7;
  int chunk[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) chunk[u] = u ^ x;
  auto at = [&](int q) { return ((q >> 3) << 3) + chunk[q & 7]; };
  auto load_a = [&](int q) { return kAGlobal ? __ldg(a4 + q) : a4[at(q)]; };
  float4 ra[kStagedChainAhead], rb[kStagedChainAhead];
#pragma unroll
  for (int q = 0; q < kStagedChainAhead; ++q) {
    ra[q] = load_a(q);
    rb[q] = b4[at(q)];
  }
#pragma unroll
  for (int q = 0; q < 64; ++q) {
    const float4 va = ra[q % kStagedChainAhead], vb = rb[q % kStagedChainAhead];
    if (q + kStagedChainAhead < 64) {
      ra[q % kStagedChainAhead] = load_a(q + kStagedChainAhead);
      rb[q % kStagedChainAhead] = b4[at(q + kStagedChainAhead)];
    }
    acc = chain_fma4(va, vb, acc);
  }
  return acc;
}

// All 64 steps of block s for N chains at once: row w against rows x + r * x_stride (r < N), each
// chain continuing from its acc[r] in its own order. Each step's w value is loaded once for the N
// chains, and the N independent fma chains hide each other's latency, so the loads run only
// kMultiChainAhead steps ahead (fewer registers).
constexpr int kMultiChainAhead = 2;
template <int N>
__device__ __forceinline__ void staged_chain_block_multi(const float* w, const float* x, int x_stride, int s, float (&acc)[N]) {
  const float4* w4 = reinterpret_cast<const float4*>(w) + (s << 6);
  const float4* x4 = reinterpret_cast<const float4*>(x) + (s << 6);
  const int xs4 = x_stride >> 2;
  const int sw = s & 7;
  int chunk[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) chunk[u] = u ^ sw;
  auto at = [&](int q) { return ((q >> 3) << 3) + chunk[q & 7]; };
  float4 rw[kMultiChainAhead], rx[kMultiChainAhead][N];
#pragma unroll
  for (int q = 0; q < kMultiChainAhead; ++q) {
    rw[q] = w4[at(q)];
#pragma unroll
    for (int r = 0; r < N; ++r) rx[q][r] = x4[r * xs4 + at(q)];
  }
#pragma unroll
  for (int q = 0; q < 64; ++q) {
    const int slot = q % kMultiChainAhead;
    const float4 vw = rw[slot];
    float4 vx[N];
#pragma unroll
    for (int r = 0; r < N; ++r) vx[r] = rx[slot][r];
    if (q + kMultiChainAhead < 64) {
      rw[slot] = w4[at(q + kMultiChainAhead)];
#pragma unroll
      for (int r = 0; r < N; ++r) rx[slot][r] = x4[r * xs4 + at(q + kMultiChainAhead)];
    }
#pragma unroll
    for (int r = 0; r < N; ++r) acc[r] = chain_fma4(vw, vx[r], acc[r]);
  }
}

// Steps [q0, q1) of block s (q0 < q1), continuing from acc, one step's loads ahead (kAGlobal as
// staged_chain_block).
template <bool kAGlobal = false>
__device__ __forceinline__ float staged_chain_steps(const float* a, const float* b, int s, int q0, int q1, float acc) {
  const float4* a4 = reinterpret_cast<const float4*>(a) + (s << 6);
  const float4* b4 = reinterpret_cast<const float4*>(b) + (s << 6);
  const int x = s & 7, xa = kAGlobal ? 0 : x;
  float4 na = a4[q0 ^ xa], nb = b4[q0 ^ x];
  for (int q = q0; q < q1; ++q) {
    const float4 va = na, vb = nb;
    if (q + 1 < q1) {
      na = a4[(q + 1) ^ xa];
      nb = b4[(q + 1) ^ x];
    }
    acc = chain_fma4(va, vb, acc);
  }
  return acc;
}

// The chain over elements [k0, k1) (k0 a multiple of 4) from zero: swizzled_chain_dot's value
// (kAGlobal as staged_chain_block).
template <bool kAGlobal = false>
__device__ __forceinline__ float staged_chain_dot(const float* a, const float* b, int k0, int k1) {
  float acc = 0.0f;
  const int k4 = k0 + ((k1 - k0) & ~3);
  int j = k0;
  while (j < k4) {
    const int s = j >> 8, b0 = s << 8, e = k4 < b0 + 256 ? k4 : b0 + 256;
    acc = j == b0 && e == b0 + 256 ? staged_chain_block<kAGlobal>(a, b, s, acc)
                                   : staged_chain_steps<kAGlobal>(a, b, s, (j - b0) >> 2, (e - b0) >> 2, acc);
    j = e;
  }
  for (; j < k1; ++j) acc = fmaf(a[kAGlobal ? j : chain_swizzle_i32(j)], b[chain_swizzle_i32(j)], acc);
  return acc;
}

// cp.async copy of row src[0, n) into the chain_swizzle layout at dst by the whole block (16-byte
// pieces, all in flight; element by element where src is not 16-byte aligned, and the last n % 4
// elements), then one commit group. The caller waits (cp_async_wait_all) and synchronises.
__device__ __forceinline__ void stage_swizzled_async(float* dst, const float* src, int n) {
  const int tid = threadIdx.x, nt = blockDim.x;
  int done = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int n4 = n >> 2;
    for (int q = tid; q < n4; q += nt) cp_async16(dst + chain_swizzle_i32(q << 2), src + (q << 2));
    done = n4 << 2;
  }
  for (int i = done + tid; i < n; i += nt) dst[chain_swizzle_i32(i)] = src[i];
  cp_async_commit();
}

}  // namespace dsv41::ops::gpu::dev
