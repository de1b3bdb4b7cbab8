// Device primitives shared by the EXL3 kernels: trellis window extraction (EXL3.md §2.2–2.4),
// the three codebooks (§2.5), 128-point Hadamard butterflies (§3.1), mma/ldmatrix wrappers (the
// cp.async ones: ops/cp_async.cuh). Only instructions that both sm_90a and sm_121a have (no wgmma/TMA).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "ops/cp_async.cuh"

namespace dsv41::exl3::dev {

constexpr float kHadScale = 0.088388347648f;  // 1/sqrt(128)
constexpr uint32_t kMul1Mult = 0x83DCD12Du;
constexpr uint32_t kMcgMult = 0xCBAC1FEDu;
constexpr uint32_t k3InstMult = 89226354u;
constexpr uint32_t k3InstAdd = 64248484u;
// MUL1 value = fp16(1024 + bytesum) * kinv + kbias (one rounding). Without that final rounding it
// is the affine kMul1Inv * bytesum + kMul1Off (exact in fp32), which the int8 path uses.
constexpr float kMul1Inv = 0.00676727294921875f;
constexpr float kMul1Bias = -10.3828125f;
constexpr float kMul1Off = 1024.0f * kMul1Inv + kMul1Bias;

// ---- trellis window ------------------------------------------------------------------------
// Lane t of a warp decodes positions 8t..8t+7 of a 16x16 tile. Their 16-bit states are windows of
// the tile's bitstream that end at bits (8t+1)K .. (8t+8)K, so the lane needs bits
// [8tK + K - 16, 8tK + 8K) (mod 256K): 2 uint32 words for K <= 4, 3 for K >= 5 (checked for every
// lane). The words are read big-endian (first word most significant) and shifted so that the
// lane's first bit is the MSB; state i is then bits [iK, iK + 16) of that normalised stream.
template <int K>
struct Tile {
  static constexpr int kWords = 8 * K;            // uint32 per tile
  static constexpr int kChunks = 2 * K;           // 16-byte chunks per tile
  static constexpr int kNw = K <= 4 ? 2 : 3;      // words a lane needs
};

template <int K>
__device__ __forceinline__ void lane_window(int lane, int (&idx)[3], int& off) {
  const int sb = 8 * lane * K + K - 16 + 256 * K;
  const int w0 = sb >> 5;
  off = sb & 31;
#pragma unroll
  for (int i = 0; i < 3; ++i) idx[i] = (w0 + i) % (8 * K);
}

// Bits [p, p+16) of the normalised stream n0:n1:n2 as a 16-bit value (p compile-time).
template <int P>
__device__ __forceinline__ uint32_t state_at(uint32_t n0, uint32_t n1, uint32_t n2) {
  if constexpr (P >= 32) {
    return state_at<P - 32>(n1, n2, 0u);
  } else if constexpr (P == 0) {
    return n0 >> 16;
  } else if constexpr (P <= 16) {
    return (n0 >> (16 - P)) & 0xFFFFu;
  } else {
    return __funnelshift_r(n1, n0, 48 - P) & 0xFFFFu;
  }
}

// Decodes the 8 states of this lane for one tile whose words start at `tile` (shared memory).
template <int K>
__device__ __forceinline__ void tile_states(const uint32_t* tile, const int (&idx)[3], int off,
                                            uint32_t (&s)[8]) {
  const uint32_t u0 = tile[idx[0]];
  const uint32_t u1 = tile[idx[1]];
  uint32_t n0 = __funnelshift_l(u1, u0, off);
  uint32_t n1, n2 = 0;
  if constexpr (Tile<K>::kNw == 3) {
    const uint32_t u2 = tile[idx[2]];
    n1 = __funnelshift_l(u2, u1, off);
    n2 = u2 << off;
  } else {
    n1 = u1 << off;
  }
  s[0] = state_at<0 * K>(n0, n1, n2);
  s[1] = state_at<1 * K>(n0, n1, n2);
  s[2] = state_at<2 * K>(n0, n1, n2);
  s[3] = state_at<3 * K>(n0, n1, n2);
  s[4] = state_at<4 * K>(n0, n1, n2);
  s[5] = state_at<5 * K>(n0, n1, n2);
  s[6] = state_at<6 * K>(n0, n1, n2);
  s[7] = state_at<7 * K>(n0, n1, n2);
}

// ---- codebooks (bit-exact fp16 values, two at a time) --------------------------------------
// CB: 0 = 3INST, 1 = MCG, 2 = MUL1. Returns half2 {value(sa), value(sb)} as a uint32.
template <int CB>
__device__ __forceinline__ uint32_t decode_pair(uint32_t sa, uint32_t sb) {
  if constexpr (CB == 2) {
    const uint32_t xa = sa * kMul1Mult, xb = sb * kMul1Mult;
    const uint32_t ha = __dp4a(xa, 0x01010101u, 0x6400u);  // fp16 bits of 1024 + bytesum
    const uint32_t hb = __dp4a(xb, 0x01010101u, 0x6400u);
    const uint32_t hh = __byte_perm(ha, hb, 0x5410);
    const __half2 k2 = __halves2half2(__ushort_as_half(0x1EEE), __ushort_as_half(0x1EEE));
    const __half2 b2 = __halves2half2(__ushort_as_half(0xC931), __ushort_as_half(0xC931));
    __half2 h = *reinterpret_cast<const __half2*>(&hh);
    __half2 v = __hfma2(h, k2, b2);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    uint32_t xa, xb;
    if constexpr (CB == 0) {
      xa = sa * k3InstMult + k3InstAdd;
      xb = sb * k3InstMult + k3InstAdd;
    } else {
      xa = sa * kMcgMult;
      xb = sb * kMcgMult;
    }
    xa = (xa & 0x8FFF8FFFu) ^ 0x3B603B60u;
    xb = (xb & 0x8FFF8FFFu) ^ 0x3B603B60u;
    const uint32_t lo = __byte_perm(xa, xb, 0x5410);
    const uint32_t hi = __byte_perm(xa, xb, 0x7632);
    __half2 v = __hadd2(*reinterpret_cast<const __half2*>(&lo),
                        *reinterpret_cast<const __half2*>(&hi));
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- tensor-core wrappers ------------------------------------------------------------------
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
}

// cp.async: the shared wrappers of ops/cp_async.cuh. The EXL3 pipelines order their stages with
// __syncthreads alone, so they take the clobber-free form.
namespace cp = ops::gpu::dev;
constexpr cp::CpOrder kCpOrder = cp::CpOrder::Free;

// ---- 128-point Sylvester Hadamard (unnormalised) on 4 values per lane ----------------------
// Lane l holds elements 4l..4l+3 of the 128-vector: strides 1 and 2 in registers, 4..64 across
// lanes by xor-shuffles.
__device__ __forceinline__ void hadamard128(float (&v)[4]) {
  float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
  v[0] = a0 + a2;
  v[1] = a1 + a3;
  v[2] = a0 - a2;
  v[3] = a1 - a3;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float o = __shfl_xor_sync(0xFFFFFFFFu, v[i], m);
      v[i] = upper ? (o - v[i]) : (v[i] + o);
    }
  }
}

// ---- programmatic dependent launch ----------------------------------------------------------
// wait: blocks until the previous kernel of the stream has completed and its writes are visible;
// launch_dependents: lets the next kernel (launched with programmatic stream serialisation) start.
// Both are no-ops on a plain launch.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- activation loads ----------------------------------------------------------------------
// dtype codes match ActType in exl3_gemm.h: 0 = fp16, 1 = bf16, 2 = fp32.
__device__ __forceinline__ float load_act(const void* p, int dtype, int64_t i) {
  if (dtype == 0) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_act(void* p, int dtype, int64_t i, float v) {
  if (dtype == 0) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else if (dtype == 1) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(p)[i] = v;
}

}  // namespace dsv41::exl3::dev
