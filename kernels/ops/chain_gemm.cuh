// Register-tiled exact "chain GEMM" for prefill-sized passes: out[t][r] = fold over the K parts p
// of chain(t, r, p), where chain is the sequential fp32 fma chain from zero over part p's K range
// [k0, k1) of x[t][.] and w[r][.], and the fold adds the chains in part order (from 0.0f, or from
// part 0's value when `from_first`). This is the order of gemm_dot_f32 (blocks of 256) and of the
// mHC mixes GEMM (dsv41/model/mix_gemm_parts.h); only the spreading of the work differs from the
// one-dot-per-block kernels.
//
// A block covers a tile of T tokens x R rows. Each warp runs whole parts: a wave of nw warps takes
// parts base .. base+nw-1 at once, lane (tg, rg) owning the TT x TR chains of tokens tg*TT.. and rows
// rg*TR.. (independent fma chains in registers). The warp stages its part chunk by chunk (32 K
// values of the T token rows and R weight rows, coalesced along K, k-major in shared memory with an
// odd row pitch so the transposing stores are conflict-free) and prefetches the next chunk into
// registers while it computes. After a wave the chains go to shared memory and the tile's running
// totals take them in part order: a left fold from 0.0f is exactly the ordered sum of the parts.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41::ops::gpu::dev {

constexpr int kChainLanesT = 4, kChainLanesR = 8;  // lane = tg * kChainLanesR + rg
constexpr int kChainChunk = 32;                    // K values staged per step (one per lane)

template <int TT, int TR>
struct ChainTile {
  static constexpr int T = kChainLanesT * TT, R = kChainLanesR * TR;
  static constexpr int XS = T + 1, WS = R + 1;  // odd pitches: lane k's stores hit distinct banks
  static constexpr int kStageFloats = kChainChunk * (XS + WS);
  static constexpr int kWarpFloats = kStageFloats + T * R;  // staging + the warp's chain results
  // Shared floats for nw warps: the running totals, then each warp's area.
  static constexpr int64_t smem_floats(int nw) { return int64_t{T} * R + int64_t{nw} * kWarpFloats; }
};

// Warps per block for `parts` parts and at most max_warps: as few waves as max_warps allows, the
// parts spread evenly over them.
inline int chain_warps(int64_t parts, int max_warps) {
  if (parts < 1) return 1;
  const int64_t waves = (parts + max_warps - 1) / max_warps;
  return static_cast<int>((parts + waves - 1) / waves);
}

// The tile's totals (T*R floats at the returned shared-memory address, t-major: o = t*R + r), valid
// after the return (the last statement is a block barrier). x: n token rows, w: rows weight rows,
// both with row pitch k; tokens and rows outside them compute zeros that the caller must not store.
// range(p, k0, k1) gives part p's K range; parts: the number of (non-empty) parts. Every thread of
// the block calls it.
template <int TT, int TR, class Range>
__device__ __forceinline__ const float* chain_tile_totals(const float* x, int64_t n, const float* w, int64_t rows,
                                                          int64_t k, int64_t t0, int64_t r0, int64_t parts, Range range,
                                                          bool from_first, float* smem) {
  using Tile = ChainTile<TT, TR>;
  constexpr int T = Tile::T, R = Tile::R, XS = Tile::XS, WS = Tile::WS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  float* tot = smem;
  float* xs = smem + T * R + warp * Tile::kWarpFloats;
  float* ws = xs + kChainChunk * XS;
  float* res = xs + Tile::kStageFloats;
  const int tg = lane / kChainLanesR, rg = lane % kChainLanesR;
  // this tile's rows; tokens and rows past the matrix are staged as zero
  const float* xb = x + t0 * k;
  const float* wb = w + r0 * k;
  const int64_t nt = n - t0, nr = rows - r0;

  for (int64_t base = 0; base < parts; base += nw) {
    const int64_t p = base + warp;
    if (p < parts) {
      int64_t k0, k1;
      range(p, k0, k1);
      float acc[TT][TR];
#pragma unroll
      for (int a = 0; a < TT; ++a)
#pragma unroll
        for (int b = 0; b < TR; ++b) acc[a][b] = 0.0f;
      float rx[T], rw[R];
      auto load = [&](int64_t kb) {
        const int64_t kk = kb + lane;
        const bool in = kk < k1;
#pragma unroll
        for (int t = 0; t < T; ++t) rx[t] = in && t < nt ? __ldg(xb + t * k + kk) : 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) rw[r] = in && r < nr ? __ldg(wb + r * k + kk) : 0.0f;
      };
      auto step = [&](int j) {
        float xv[TT], wv[TR];
#pragma unroll
        for (int a = 0; a < TT; ++a) xv[a] = xs[j * XS + tg * TT + a];
#pragma unroll
        for (int b = 0; b < TR; ++b) wv[b] = ws[j * WS + rg * TR + b];
#pragma unroll
        for (int a = 0; a < TT; ++a)
#pragma unroll
          for (int b = 0; b < TR; ++b) acc[a][b] = fmaf(wv[b], xv[a], acc[a][b]);
      };
      if (k0 < k1) load(k0);
      for (int64_t kb = k0; kb < k1; kb += kChainChunk) {
#pragma unroll
        for (int t = 0; t < T; ++t) xs[lane * XS + t] = rx[t];
#pragma unroll
        for (int r = 0; r < R; ++r) ws[lane * WS + r] = rw[r];
        __syncwarp();
        if (kb + kChainChunk < k1) load(kb + kChainChunk);  // in flight during this chunk's chains
        const int64_t len = k1 - kb < kChainChunk ? k1 - kb : kChainChunk;
        if (len == kChainChunk) {
#pragma unroll
          for (int j = 0; j < kChainChunk; ++j) step(j);
        } else {
          for (int j = 0; j < len; ++j) step(j);
        }
        __syncwarp();  // every lane's reads are done before the next chunk's stores
      }
#pragma unroll
      for (int a = 0; a < TT; ++a)
#pragma unroll
        for (int b = 0; b < TR; ++b) res[(tg * TT + a) * R + rg * TR + b] = acc[a][b];
    }
    __syncthreads();
    // the wave's chains, in part order, onto the running totals (each thread keeps its outputs)
    const int64_t in_wave = parts - base < nw ? parts - base : nw;
    for (int o = threadIdx.x; o < T * R; o += blockDim.x) {
      float total = base == 0 ? 0.0f : tot[o];
      for (int64_t g = 0; g < in_wave; ++g) {
        const float v = smem[T * R + g * Tile::kWarpFloats + Tile::kStageFloats + o];
        total = from_first && base + g == 0 ? v : __fadd_rn(total, v);
      }
      tot[o] = total;
    }
    __syncthreads();  // the next wave overwrites the chain results
  }
  return tot;
}

}  // namespace dsv41::ops::gpu::dev
