// Block-level EXL3 matmul building blocks of the large-m linear kernel (exl3_gemm) and the
// grouped MoE kernels (exl3_moe). A block of 256 threads (8 warps) owns one group of 128 output
// columns (8 tiles of 16) and a contiguous range of k-tiles, and leaves the partial product
// sum_k x_had[t][k] * W_hat[k][c] (before the output Hadamard) in shared memory.
//
// Orientation: the mma computes D (16 output columns x 8 rows of x) = W_hat_tile^T · x^T, so a
// decoded tile is the A operand and x the B operand. In EXL3.md §2.4 order, lane t's 8 states are
// exactly the A fragment (a register permutation {i0i1, i4i5, i2i3, i6i7}), and one mma covers up
// to 8 rows of x: decode cost is paid once per tile for all rows.
#pragma once
#include <type_traits>

#include "exl3/exl3_device.cuh"
#include "exl3/exl3_gemm.h"

namespace dsv41::exl3::dev {

constexpr int kThreads = 256;
constexpr int kWarps = 8;

// Where a block reads x from. mode 0: raw activations (multiply by suh, 128-point Hadamard);
// mode 1: already in the Hadamard basis (e.g. the MoE down input written by the gate/up kernel).
struct XSource {
  const void* p;
  int dtype;  // ActType code
  int mode;
  int m;  // valid rows
  int64_t stride, cols;
  const uint16_t* suh;  // used in mode 0
};

// ---- shared-memory plan -------------------------------------------------------------------
// Each warp streams its own column of tiles through a cp.async ring of groups of 8 k-tiles
// (k ranges are multiples of 128 rows, so a range is a whole number of groups). 3-4 groups keep
// 16-24 tiles per warp in flight while a group is being computed.
constexpr int kGroup = 8;
__host__ __device__ constexpr int ring_groups(int K) { return K <= 4 ? 4 : 3; }
__host__ __device__ constexpr int ring_bytes(int K) { return kWarps * ring_groups(K) * kGroup * 8 * K * 4; }
__host__ __device__ constexpr int small_x_bytes(bool int8, int rows) {
  return int8 ? (rows / 16) * 32 * 16 : 8 * (rows + 8) * 2;
}
constexpr int kRedBytes = 8 * 128 * 4;
constexpr int kStatBytes = 64;
__host__ __device__ constexpr int small_smem_bytes(int K, bool int8, int rows) {
  return ring_bytes(K) + small_x_bytes(int8, rows) + kRedBytes + kStatBytes;
}
// Scratch of the x staging kernels (stage_x, int8): [4][rows] fp32.
__host__ __device__ constexpr int stage_h_bytes(bool int8, int rows) { return int8 ? 4 * rows * 4 : 0; }
// Large-m block of 16H rows: trellis ring + two x buffers [16H][136] fp16 (the reduction aliases them).
constexpr int kLargeXStride = 136;
__host__ __device__ constexpr int large_smem_bytes(int K, int H = 4) {
  return ring_bytes(K) + 2 * 16 * H * kLargeXStride * 2;
}

// Loads 4 consecutive activations of row `t` (columns k..k+3), zero outside the valid area.
__device__ __forceinline__ void load4(const XSource& xs, int t, int64_t k, float (&v)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int64_t c = k + e;
    float x = 0.0f;
    if (t < xs.m && c < xs.cols) {
      x = load_act(xs.p, xs.dtype, t * xs.stride + c);
      if (xs.mode == 0) x *= __half2float(__ushort_as_half(xs.suh[c]));
    }
    v[e] = x;
  }
  if (xs.mode == 0) {
    hadamard128(v);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] *= kHadScale;
  }
}

// One warp's column of tiles through the ring, a group of 8 consecutive k-tiles at a time.
template <int K>
struct ColumnStream {
  static constexpr int NG = ring_groups(K);
  static constexpr int TW = Tile<K>::kWords;
  static constexpr int CH = 2 * K * kGroup;  // 16-byte chunks per group
  uint32_t* ring;       // NG * kGroup * TW words of this warp
  const uint16_t* col;  // tile (kt0, column)
  size_t row_stride;    // uint16 between consecutive k-tiles
  int ngroups, lane;
  __device__ __forceinline__ void prefetch(int gi) {
    if (gi < ngroups) {
      uint32_t* dst = ring + (gi % NG) * kGroup * TW;
      const uint16_t* src = col + static_cast<size_t>(gi) * kGroup * row_stride;
#pragma unroll
      for (int c = lane; c < CH; c += 32) {
        const int j = c / (2 * K), part = c % (2 * K);
        cp::cp_async16<kCpOrder>(dst + j * TW + part * 4, src + j * row_stride + part * 8);
      }
    }
    cp::cp_async_commit<kCpOrder>();
  }
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int g = 0; g < NG - 1; ++g) prefetch(g);
  }
  // Waits for group gi (issuing group gi + NG - 1) and returns its first tile's words.
  __device__ __forceinline__ const uint32_t* wait(int gi) {
    prefetch(gi + NG - 1);
    cp::cp_async_wait<NG - 1, kCpOrder>();
    __syncwarp();
    return ring + (gi % NG) * kGroup * TW;
  }
};

// ---- small m (<= 8 rows; <= 4 on the int8 path), used by the MoE kernels ------------------
// Stages x_had for k-tiles [kt0, kt1) in the B-fragment format of the path: int8 fragments
// [k-tile][lane] uint4 (+ per-token amax and level sums in stat_*), or fp16 rows [8][xstride].
// `xout` may be shared or global memory; hbuf (int8) is shared scratch [4][rows].
template <bool INT8>
__device__ void stage_x(const XSource& xs, int kt0, int kt1, unsigned char* xout, int xstride, float* hbuf,
                        uint32_t* stat_amax, int* stat_hi, int* stat_lo) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rows = (kt1 - kt0) * 16;
  const int nkt = kt1 - kt0;
  const int nb = rows / 128;
  if constexpr (INT8) {
    if (tid < 4) {
      stat_amax[tid] = 0u;
      stat_hi[tid] = 0;
      stat_lo[tid] = 0;
    }
    __syncthreads();
    for (int it = warp; it < xs.m * nb; it += kWarps) {
      const int t = it / nb, b = it % nb;
      float v[4];
      load4(xs, t, static_cast<int64_t>(kt0) * 16 + b * 128 + 4 * lane, v);
      float mx = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        hbuf[t * rows + b * 128 + 4 * lane + e] = v[e];
        mx = fmaxf(mx, fabsf(v[e]));
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
      if (lane == 0) atomicMax(&stat_amax[t], __float_as_uint(mx));
    }
    __syncthreads();
    // Two int8 levels per value: a / s = hi + lo / 254 with s = amax / 127. Unit u covers 4 values
    // (k-tile, token r, lane group tig) and writes the hi and lo fragments; r and tig are fixed
    // per thread (kThreads is a multiple of 16).
    uint4* frag = reinterpret_cast<uint4*>(xout);
    const int r = (tid >> 2) & 3, tig = tid & 3;
    const bool live = r < xs.m;
    const float amax = live ? __uint_as_float(stat_amax[r]) : 0.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const float* hrow = hbuf + r * rows + 2 * tig;
    int sum_hi = 0, sum_lo = 0;
    for (int u = tid; u < nkt * 16; u += kThreads) {
      const int ktr = u >> 4;
      uint4 qh = make_uint4(0, 0, 0, 0), ql = qh;
      if (live) {
        const int koff[4] = {0, 8, 1, 9};
        uint32_t h[4], l[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float a = hrow[ktr * 16 + koff[i]] * inv;
          const float hi = fminf(fmaxf(rintf(a), -127.0f), 127.0f);
          const float lo = fminf(fmaxf(rintf((a - hi) * 254.0f), -127.0f), 127.0f);
          const int hv = static_cast<int>(hi), lv = static_cast<int>(lo);
          sum_hi += hv;
          sum_lo += lv;
          h[i] = (static_cast<uint32_t>(hv) & 0xFFu) * 0x01010101u;
          l[i] = (static_cast<uint32_t>(lv) & 0xFFu) * 0x01010101u;
        }
        qh = make_uint4(h[0], h[1], h[2], h[3]);
        ql = make_uint4(l[0], l[1], l[2], l[3]);
      }
      frag[ktr * 32 + (2 * r) * 4 + tig] = qh;
      frag[ktr * 32 + (2 * r + 1) * 4 + tig] = ql;
    }
    // Lanes sharing r: lane = 16x + 4r + tig.
#pragma unroll
    for (int o : {1, 2, 16}) {
      sum_hi += __shfl_xor_sync(0xFFFFFFFFu, sum_hi, o);
      sum_lo += __shfl_xor_sync(0xFFFFFFFFu, sum_lo, o);
    }
    if ((lane & 19) == 0 && live) {
      atomicAdd(&stat_hi[r], sum_hi);
      atomicAdd(&stat_lo[r], sum_lo);
    }
  } else {
    __half* xh = reinterpret_cast<__half*>(xout);
    for (int it = warp; it < 8 * nb; it += kWarps) {
      const int t = it / nb, b = it % nb;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t < xs.m) load4(xs, t, static_cast<int64_t>(kt0) * 16 + b * 128 + 4 * lane, v);
      __half2* dst = reinterpret_cast<__half2*>(xh + t * xstride + b * 128 + 4 * lane);
      dst[0] = __floats2half2_rn(v[0], v[1]);
      dst[1] = __floats2half2_rn(v[2], v[3]);
    }
  }
  __syncthreads();
}

// Warp w streams column tile w of the group over k-tiles [kt0, kt1); x comes pre-staged by a
// staging kernel (stage_x): `xpre` is the whole x as int8 fragments [k/16][32] uint4 or fp16 rows
// [8][k], `xstats` this block's int8 statistics {amax bits, sum hi, sum lo} per token. The
// trellis prefetch starts before the programmatic-launch wait for the staging kernel.
// Returns red[8][128] in shared memory (the int8 path fills rows 0..3).
template <int K, int CB, bool INT8>
__device__ float* small_block(const cuda::Exl3Matrix& w, int ng, int kt0, int kt1, unsigned char* smem,
                              const void* xpre, const int4* xstats) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rows = (kt1 - kt0) * 16;
  const int nkt = kt1 - kt0;
  unsigned char* xbuf = smem + ring_bytes(K);
  float* red = reinterpret_cast<float*>(xbuf + small_x_bytes(INT8, rows));
  uint32_t* stat_amax = reinterpret_cast<uint32_t*>(red + 8 * 128);
  int* stat_hi = reinterpret_cast<int*>(stat_amax + 4);
  int* stat_lo = stat_hi + 4;

  const int ntn = w.n / 16;
  constexpr int TW = Tile<K>::kWords;
  ColumnStream<K> cs{reinterpret_cast<uint32_t*>(smem) + warp * ColumnStream<K>::NG * kGroup * TW,
                     w.trellis + (static_cast<size_t>(kt0) * ntn + ng * 8 + warp) * 16 * K,
                     static_cast<size_t>(ntn) * 16 * K, nkt / kGroup, lane};
  cs.start();
  griddep_wait();
  griddep_launch_dependents();
  if constexpr (INT8) {
    const uint4* src = reinterpret_cast<const uint4*>(xpre) + static_cast<size_t>(kt0) * 32;
    for (int c = tid; c < nkt * 32; c += kThreads) reinterpret_cast<uint4*>(xbuf)[c] = __ldcg(src + c);
    if (tid < 4) {
      const int4 st = __ldcg(xstats + tid);
      stat_amax[tid] = static_cast<uint32_t>(st.x);
      stat_hi[tid] = st.y;
      stat_lo[tid] = st.z;
    }
  } else {
    const __half* src = reinterpret_cast<const __half*>(xpre) + static_cast<size_t>(kt0) * 16;
    const int cpr = rows / 8;  // 16-byte chunks per row
    for (int c = tid; c < 8 * cpr; c += kThreads) {
      const int t = c / cpr, q = c % cpr;
      *reinterpret_cast<uint4*>(reinterpret_cast<__half*>(xbuf) + t * (rows + 8) + q * 8) =
          __ldcg(reinterpret_cast<const uint4*>(src + static_cast<size_t>(t) * w.k + q * 8));
    }
  }
  __syncthreads();

  int idx[3], off;
  lane_window<K>(lane, idx, off);
  using Acc = std::conditional_t<INT8, int, float>;
  Acc acc[4] = {0, 0, 0, 0};
  for (int gi = 0; gi < nkt / kGroup; ++gi) {
    const uint32_t* grp = cs.wait(gi);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int s = gi * kGroup + j;
      uint32_t st[8];
      tile_states<K>(grp + j * TW, idx, off, st);
      if constexpr (INT8) {
        const uint4 bf = reinterpret_cast<const uint4*>(xbuf)[s * 32 + lane];
#pragma unroll
        for (int i = 0; i < 8; ++i) st[i] *= kMul1Mult;
        mma_u8s8(acc, st[0], st[4], st[2], st[6], bf.x, bf.y);
        mma_u8s8(acc, st[1], st[5], st[3], st[7], bf.z, bf.w);
      } else {
        uint32_t b0, b1;
        const __half* xh = reinterpret_cast<const __half*>(xbuf);
        ldmatrix_x2(b0, b1, xh + (lane & 7) * (rows + 8) + s * 16 + ((lane >> 3) & 1) * 8);
        uint32_t a[4];
        a[0] = decode_pair<CB>(st[0], st[1]);
        a[1] = decode_pair<CB>(st[4], st[5]);
        a[2] = decode_pair<CB>(st[2], st[3]);
        a[3] = decode_pair<CB>(st[6], st[7]);
        mma_f16(acc, a, b0, b1);
      }
    }
    __syncwarp();
  }
  cp::cp_async_wait<0, kCpOrder>();

  // ---- results: warps own disjoint columns ----
  const int g = lane >> 2, tig = lane & 3, c = 16 * warp + g;
  if constexpr (INT8) {
    const float s = __uint_as_float(stat_amax[tig]) / 127.0f;
    // The affine codebook's constant term: kMul1Off * sum_k x_had[t][k] (quantised values).
    const float base = kMul1Off * s * (static_cast<float>(stat_hi[tig]) + static_cast<float>(stat_lo[tig]) / 254.0f);
    const float sc = kMul1Inv * s;
    red[tig * 128 + c] = sc * (static_cast<float>(acc[0]) + static_cast<float>(acc[1]) / 254.0f) + base;
    red[tig * 128 + c + 8] = sc * (static_cast<float>(acc[2]) + static_cast<float>(acc[3]) / 254.0f) + base;
  } else {
    red[(2 * tig) * 128 + c] = acc[0];
    red[(2 * tig + 1) * 128 + c] = acc[1];
    red[(2 * tig) * 128 + c + 8] = acc[2];
    red[(2 * tig + 1) * 128 + c + 8] = acc[3];
  }
  __syncthreads();
  return red;
}

// ---- large m (16H rows per block, H = 1..4) ---------------------------------------------------
// x_had [m][k] fp16 comes from the input-transform kernel. Warp w owns column tile w of the group;
// every decoded tile feeds 2 mma per 16-row slice (none for slices at or past `hmax`, the slices
// holding valid rows). x is staged 128 k-rows at a time, double-buffered through registers; the
// eight k-tiles of a chunk are unrolled so that every shared-memory address is a per-lane base plus
// a constant. Results: red[16H][128] (aliases the x buffers).
template <int K, int CB, int H>
__device__ void large_block(const cuda::Exl3Matrix& w, const __half* xh, int m, int tok0, int ng,
                            int kt0, int kt1, int hmax, unsigned char* smem, float* red) {
  static_assert(H >= 1 && H <= 4, "16 to 64 rows a block");
  constexpr int TW = Tile<K>::kWords;
  constexpr int ROWS = 16 * H;
  constexpr int XBUF = ROWS * kLargeXStride;
  constexpr int LOADS = ROWS * 16 / kThreads;  // 16-byte pieces of a chunk per thread
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __half* xs = reinterpret_cast<__half*>(smem + ring_bytes(K));
  const int ntn = w.n / 16;
  const int nsteps = kt1 - kt0;
  const int nch = nsteps / 8;
  ColumnStream<K> cs{reinterpret_cast<uint32_t*>(smem) + warp * ColumnStream<K>::NG * kGroup * TW,
                     w.trellis + (static_cast<size_t>(kt0) * ntn + ng * 8 + warp) * 16 * K,
                     static_cast<size_t>(ntn) * 16 * K, nsteps / kGroup, lane};
  // This thread's pieces: rows tid / 16 + 16 i, 16-byte column piece tid % 16.
  const int prow = tid >> 4, pcol = (tid & 15) * 8;
  const __half* xsrc = xh + static_cast<size_t>(tok0 + prow) * w.k + static_cast<size_t>(kt0) * 16 + pcol;
  auto load_chunk = [&](int c, uint4 (&r)[LOADS]) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      r[i] = make_uint4(0, 0, 0, 0);
      if (tok0 + prow + 16 * i < m)
        r[i] = *reinterpret_cast<const uint4*>(xsrc + static_cast<size_t>(16 * i) * w.k + c * 128);
    }
  };
  auto store_chunk = [&](int buf, const uint4 (&r)[LOADS]) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i)
      *reinterpret_cast<uint4*>(xs + buf * XBUF + (prow + 16 * i) * kLargeXStride + pcol) = r[i];
  };

  cs.start();
  {
    uint4 r[LOADS];
    load_chunk(0, r);
    store_chunk(0, r);
  }
  __syncthreads();

  int idx[3], off;
  lane_window<K>(lane, idx, off);
  // ldmatrix.x4 of slice h: rows 16h + (lane & 7) + 8 (lane >= 16), k-half (lane >> 3) & 1.
  const int xlane = ((lane & 7) + ((lane >> 4) << 3)) * kLargeXStride + ((lane >> 3) & 1) * 8;
  float acc[2 * H][4];
#pragma unroll
  for (int j = 0; j < 2 * H; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  for (int c = 0; c < nch; ++c) {
    uint4 nx[LOADS];
    if (c + 1 < nch) load_chunk(c + 1, nx);
    const __half* xb = xs + (c & 1) * XBUF + xlane;
    const uint32_t* grp = cs.wait(c);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      uint32_t st[8];
      tile_states<K>(grp + ks * TW, idx, off, st);
      uint32_t a[4];
      a[0] = decode_pair<CB>(st[0], st[1]);
      a[1] = decode_pair<CB>(st[4], st[5]);
      a[2] = decode_pair<CB>(st[2], st[3]);
      a[3] = decode_pair<CB>(st[6], st[7]);
#pragma unroll
      for (int h = 0; h < H; ++h) {
        if (h < hmax) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(b0, b1, b2, b3, xb + 16 * h * kLargeXStride + ks * 16);
          mma_f16(acc[2 * h], a, b0, b1);
          mma_f16(acc[2 * h + 1], a, b2, b3);
        }
      }
    }
    if (c + 1 < nch) store_chunk((c + 1) & 1, nx);
    __syncthreads();
  }
  cp::cp_async_wait<0, kCpOrder>();
  __syncthreads();
  const int g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int j = 0; j < 2 * H; ++j) {
    const int t = 8 * j + 2 * tig, col = 16 * warp + g;
    red[t * 128 + col] = acc[j][0];
    red[(t + 1) * 128 + col] = acc[j][1];
    red[t * 128 + col + 8] = acc[j][2];
    red[(t + 1) * 128 + col + 8] = acc[j][3];
  }
  __syncthreads();
}

// ---- epilogue helpers ----------------------------------------------------------------------
// sum_{sp < n} p[sp * stride] in split order, with the L2 loads issued 8 at a time.
__device__ __forceinline__ float sum_splits(const float* p, size_t stride, int n) {
  float s = 0.0f;
  int sp = 0;
  for (; sp + 8 <= n; sp += 8) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __ldcg(p + (sp + i) * stride);
#pragma unroll
    for (int i = 0; i < 8; ++i) s += v[i];
  }
  for (; sp < n; ++sp) s += __ldcg(p + sp * stride);
  return s;
}

// Output Hadamard of one 128-column row held in red (4 values per lane), times 1/sqrt(128)*svh.
__device__ __forceinline__ void out_transform(const float* row, const uint16_t* svh, int col0,
                                              float (&v)[4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = row[4 * lane + e];
  hadamard128(v);
#pragma unroll
  for (int e = 0; e < 4; ++e)
    v[e] *= kHadScale * __half2float(__ushort_as_half(svh[col0 + 4 * lane + e]));
}

}  // namespace dsv41::exl3::dev
