// The K order of the mHC mixes GEMM (F.linear(x[rows][K], hc_fn) in fp32, K = hc·dim), shared by
// the CPU engine (src/model/ops/mhc.cpp) and the CUDA kernel (kernels/ops/mhc.cu). Each part of K is one
// sequential fused multiply-add chain; the parts are then added in K order. Which parts the
// reference's BLAS used depends on the call:
//   kMixGemmChunks (0): chains of 256 added to zero in K order (ops/dot.h) — decode steps and
//     small prefills;
//   kMixGemmBlocked (-1): the blocked path of MKL's AVX-512 sgemm: chains of 384 while at least
//     768 remain, then the rest as one chain, or as two halves (the first rounded up) when it is
//     longer than 384 (K = 1024: 384 + 320 + 320; K = 20480: 52 × 384 + 256 + 256);
//   P > 0: P parts of whole 64-element units, the first K/64 mod P parts one unit longer (an
//     explicit override).
// kMixGemmAuto (the engines' default) picks by the reference call's row count, as MKL 2020.4 on
// AVX-512 does with 8 to 64 threads (measured: sgemm_("t","n", 24, rows, K)): rows >= 129 take the
// blocked path, fewer rows a K-parallel split, which for K = 1024 is four chains of 256 (the
// chunks order). Below 129 rows the split depends on the thread count for other K, and one-row
// calls use a kernel no chain model fits; both keep the chunks order.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DSV41_MIX_HD __host__ __device__
#else
#define DSV41_MIX_HD
#endif

namespace dsv41::model {

inline constexpr int64_t kMixGemmAuto = -2, kMixGemmBlocked = -1, kMixGemmChunks = 0;
inline constexpr int64_t kMixGemmChunk = 256, kMixGemmBlockedChain = 384, kMixGemmUnit = 64;
inline constexpr int64_t kMixGemmBlockedFromRows = 129;

// The K order a reference call of rows_ref rows used, given the engine option (kMixGemmAuto,
// kMixGemmChunks, kMixGemmBlocked or P > 0).
inline int64_t resolve_mix_gemm_parts(int64_t option, int64_t rows_ref) {
  if (option != kMixGemmAuto) return option;
  return rows_ref >= kMixGemmBlockedFromRows ? kMixGemmBlocked : kMixGemmChunks;
}

// Number of K parts (chains) of a resolved order over k inputs.
DSV41_MIX_HD inline int64_t mix_gemm_part_count(int64_t k, int64_t parts) {
  if (parts > 0) return parts;
  if (parts == kMixGemmBlocked) {
    const int64_t c = kMixGemmBlockedChain, full = k >= 2 * c ? (k - 2 * c) / c + 1 : 0, rest = k - full * c;
    return full + (rest > c ? 2 : rest > 0 ? 1 : 0);
  }
  return (k + kMixGemmChunk - 1) / kMixGemmChunk;
}

// K range [k0, k1) of part p (may be empty for P parts once K is covered).
DSV41_MIX_HD inline void mix_gemm_part_range(int64_t k, int64_t parts, int64_t p, int64_t& k0, int64_t& k1) {
  if (parts > 0) {
    const int64_t units = (k + kMixGemmUnit - 1) / kMixGemmUnit, base = units / parts, extra = units % parts;
    k0 = (p * base + (p < extra ? p : extra)) * kMixGemmUnit;
    k1 = k0 + (base + (p < extra ? 1 : 0)) * kMixGemmUnit;
  } else if (parts == kMixGemmBlocked) {
    const int64_t c = kMixGemmBlockedChain, full = k >= 2 * c ? (k - 2 * c) / c + 1 : 0, rest = k - full * c;
    if (p < full) {
      k0 = p * c;
      k1 = k0 + c;
    } else if (p == full) {
      k0 = full * c;
      k1 = k0 + (rest > c ? (rest + 1) / 2 : rest);
    } else {
      k1 = k;
      k0 = k - rest / 2;
    }
  } else {
    k0 = p * kMixGemmChunk;
    k1 = k0 + kMixGemmChunk;
  }
  k0 = k0 < k ? k0 : k;
  k1 = k1 < k ? k1 : k;
}

}  // namespace dsv41::model
