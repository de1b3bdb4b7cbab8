// Sparse attention with a sink (MODEL.md §4 SparseAttn). One KV row is key and value, shared by all
// heads (MQA), so a block stages each 64-entry chunk of its query's list in shared memory once and
// runs `heads_per_block` heads over it. Per head and chunk, exactly the reference's steps: scores as
// dot.h fma chains (one thread per 256-wide half), online max, fp32 probabilities summed in the
// reference's torch_sum order, bf16 probabilities in PV summed in list order, acc·c + pv, sink in
// the denominator after the loop. Decode uses 1 head per block (more blocks for one query),
// prefill several (fewer re-reads of the staged rows). Few queries (decode) take the split kernel
// below instead (same arithmetic, spread over a cluster of blocks), many queries (prefill passes)
// the tiled kernel of sparse_attn_tiled.cuh (same arithmetic, all heads of a group at once).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "ops/cp_async.cuh"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 64;

struct Smem {
  uint16_t* rows;  // [kChunk][d]
  float* q;        // [hpb][d]
  float* acc;      // [hpb][d]
  float* part;     // [kChunk][2]
  float* pb;       // [kChunk] bf16-rounded probabilities
  float* p;        // [kChunk] fp32 probabilities
  float* ml;       // [hpb][2]: running max, denominator
  float* c;        // [1]
  const uint16_t** rowptr;  // [kChunk]
};

__host__ __device__ size_t smem_bytes(int64_t d, int hpb) {
  return static_cast<size_t>(kChunk * d * 2 + 2 * hpb * d * 4 + kChunk * 4 * 4 + hpb * 8 + 16) + kChunk * sizeof(void*);
}

__global__ void sparse_attn_kernel(SparseAttnArgs a, int hpb) {
  dev::pdl_enter();
  extern __shared__ __align__(16) unsigned char raw_smem[];
  const int64_t d = a.d;
  Smem sm;
  unsigned char* p = raw_smem;
  sm.rows = reinterpret_cast<uint16_t*>(p);
  p += kChunk * d * 2;
  sm.rowptr = reinterpret_cast<const uint16_t**>(p);
  p += kChunk * sizeof(void*);
  sm.q = reinterpret_cast<float*>(p);
  p += hpb * d * 4;
  sm.acc = reinterpret_cast<float*>(p);
  p += hpb * d * 4;
  sm.part = reinterpret_cast<float*>(p);
  p += kChunk * 2 * 4;
  sm.pb = reinterpret_cast<float*>(p);
  p += kChunk * 4;
  sm.p = reinterpret_cast<float*>(p);
  p += kChunk * 4;
  sm.ml = reinterpret_cast<float*>(p);
  p += hpb * 8;
  sm.c = reinterpret_cast<float*>(p);

  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * hpb;
  const int nh = static_cast<int>(a.heads - h0 < hpb ? a.heads - h0 : hpb);
  const int tid = threadIdx.x, lane = tid & 31;
  for (int64_t i = tid; i < nh * d; i += kThreads) {
    sm.q[i] = a.q[(t * a.heads + h0) * d + i];
    sm.acc[i] = 0.0f;
  }
  if (tid < nh) {
    sm.ml[2 * tid] = -1e30f;
    sm.ml[2 * tid + 1] = 0.0f;
  }
  const int32_t* list = a.list + t * a.list_len;
  const uint16_t* pool_a = a.pool_a[t];
  const uint16_t* pool_b = a.pool_b ? a.pool_b[t] : nullptr;
  const int nblk = static_cast<int>((d + dev::kGemmKBlock - 1) / dev::kGemmKBlock);  // 1 or 2
  for (int64_t c0 = 0; c0 < a.list_len; c0 += kChunk) {
    const int cn = static_cast<int>(a.list_len - c0 < kChunk ? a.list_len - c0 : kChunk);
    __syncthreads();
    if (tid < kChunk) {
      const uint16_t* r = nullptr;
      if (tid < cn) {
        const int32_t e = list[c0 + tid];
        if (e >= 0 && e < a.split) r = pool_a ? pool_a + static_cast<int64_t>(e) * d : nullptr;
        else if (e >= a.split) r = pool_b ? pool_b + static_cast<int64_t>(e - a.split) * d : nullptr;
      }
      sm.rowptr[tid] = r;
    }
    __syncthreads();
    const int64_t vecs = d / 8;
    for (int64_t i = tid; i < cn * vecs; i += kThreads) {
      const int64_t j = i / vecs, v = i % vecs;
      if (sm.rowptr[j]) reinterpret_cast<uint4*>(sm.rows + j * d)[v] = reinterpret_cast<const uint4*>(sm.rowptr[j])[v];
    }
    __syncthreads();
    for (int hh = 0; hh < nh; ++hh) {
      const float* q = sm.q + hh * d;
      {
        const int j = tid >> 1, half = tid & 1;
        float part = 0.0f;
        if (j < cn && sm.rowptr[j] && half < nblk) {
          const uint16_t* row = sm.rows + j * d;
          const int64_t k0 = half * dev::kGemmKBlock;
          const int64_t k1 = k0 + dev::kGemmKBlock < d ? k0 + dev::kGemmKBlock : d;
          part = dev::dot_block([&](int64_t k) { return q[k]; }, [&](int64_t k) { return dev::bf16_bits_to_f32(row[k]); },
                                k0, k1);
        }
        sm.part[j * 2 + half] = part;
      }
      __syncthreads();
      if (tid < 32) {
        float s[2];
        float mx = -INFINITY;
        for (int r = 0; r < 2; ++r) {
          const int j = lane + 32 * r;
          s[r] = -INFINITY;
          if (j < cn && sm.rowptr[j]) {
            float tot = __fadd_rn(0.0f, sm.part[j * 2]);
            if (nblk > 1) tot = __fadd_rn(tot, sm.part[j * 2 + 1]);
            s[r] = __fmul_rn(tot, a.scale);
            mx = mx < s[r] ? s[r] : mx;
          }
        }
        mx = dev::warp_max(mx);
        const float m = sm.ml[2 * hh];
        const float m_new = m < mx ? mx : m;
        const float c = dev::exp_ref(__fsub_rn(m, m_new));
        for (int r = 0; r < 2; ++r) {
          const int j = lane + 32 * r;
          if (j < cn) {
            const float pj = dev::exp_ref(__fsub_rn(s[r], m_new));
            sm.p[j] = pj;
            sm.pb[j] = dev::bf16_round(pj);
          }
        }
        __syncwarp();
        const float psum = dev::warp_torch_sum([&](int64_t i) { return sm.p[i]; }, cn);
        if (lane == 0) {
          sm.ml[2 * hh + 1] = __fadd_rn(__fmul_rn(sm.ml[2 * hh + 1], c), psum);
          sm.ml[2 * hh] = m_new;
          sm.c[0] = c;
        }
      }
      __syncthreads();
      const float c = sm.c[0];
      float* acc = sm.acc + hh * d;
      for (int64_t k = tid; k < d; k += kThreads) {
        float pv = 0.0f;
        for (int j = 0; j < cn; ++j)
          if (sm.rowptr[j]) pv = __fadd_rn(pv, __fmul_rn(sm.pb[j], dev::bf16_bits_to_f32(sm.rows[j * d + k])));
        acc[k] = __fadd_rn(__fmul_rn(acc[k], c), pv);
      }
      __syncthreads();
    }
  }
  __syncthreads();
  for (int hh = 0; hh < nh; ++hh) {
    const float l = __fadd_rn(sm.ml[2 * hh + 1], dev::exp_ref(__fsub_rn(a.sink[h0 + hh], sm.ml[2 * hh])));
    float* out = a.out + (t * a.heads + h0 + hh) * d;
    for (int64_t k = tid; k < d; k += kThreads) out[k] = dev::bf16_round(__fdiv_rn(sm.acc[hh * d + k], l));
  }
}


// ---- split kernel (few queries) ------------------------------------------------------------------
// The reference's running max after chunk c is max(-1e30, every score of chunks 0..c) (max is
// exact and ignores NaN both there and here), so once all scores exist every chunk's m, c = exp(m'
// - m), probabilities, psum and PV are independent; only the l and acc recurrences run over the
// chunks in order, and those are short (one step per 64 entries). A cluster of C blocks serves one
// query and G heads:
//   1. block r stages its 1/C of the rows in shared memory (coalesced asynchronous copies), scores
//      them (the dot.h chains) and pushes the scores into every block's shared memory;
//   2. the (head, chunk) softmax tasks are spread over the warps of the whole cluster (one round for
//      the decode shapes): each derives its chunk's m, c, probabilities and psum once and pushes c,
//      psum and the bf16 probabilities into every block;
//   3. block r runs the PV chains (list order inside a chunk) for its 1/C of the d lanes, read from
//      a lane slice of every row staged while steps 1-2 ran, then the acc·c + pv recurrence and the
//      final division.
// Skipped entries are staged as zero lanes with probability 0, so the PV chains need no branch:
// pv + 0·0 = pv exactly (pv starts at +0 and a round-to-nearest sum is -0 only when both addends
// are, so adding +0 never changes it; inf and NaN stay).
// Variants (cluster size, heads per cluster, threads) trade blocks per query against resident
// clusters: 8 blocks of 512 threads hold one SM each, 16 blocks of 256 threads fit two per SM.
constexpr int64_t kSplitMaxList = 1024;
constexpr int64_t kSplitMaxQueries = 32;

struct SplitLayout {
  int64_t n, nc, rows, ks, nblk;  // entries, chunks, rows scored per block, d lanes per block, K blocks
  int64_t srow;  // staged score row stride (bf16 values): d + 8 keeps 16-byte rows on distinct banks
  size_t rowptr, q, s, pb, cc, psum, mlast, l, scratch, stage, total;  // byte offsets
};

// PB: bytes per staged probability (4: fp32, 2: its bf16 bits, which are exact since the values are
// bf16-rounded; the smaller layout lets two blocks share an SM).
template <int C, int G, int T, int PB>
__host__ __device__ inline SplitLayout split_layout(int64_t n, int64_t d) {
  constexpr int kWarpsT = T / 32;
  SplitLayout L;
  L.n = n;
  L.nc = (n + kChunk - 1) / kChunk;
  L.rows = (n + C - 1) / C;
  L.ks = 2 * ((d + 2 * C - 1) / (2 * C));
  L.nblk = (d + dev::kGemmKBlock - 1) / dev::kGemmKBlock;
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o += (bytes + 15) / 16 * 16;
    return at;
  };
  auto most = [](size_t x, size_t y) { return x > y ? x : y; };
  L.rowptr = take(static_cast<size_t>(n) * sizeof(void*));
  L.q = take(static_cast<size_t>(G * d) * 4);
  // The scores [G][n] (steps 1-2), then the PV sums [nc][G][ks] (step 3).
  L.s = take(most(static_cast<size_t>(G * n) * 4, static_cast<size_t>(L.nc * G * L.ks) * 4));
  L.pb = take(static_cast<size_t>(n * G) * PB);
  L.cc = take(static_cast<size_t>(G * L.nc) * 4);
  L.psum = take(static_cast<size_t>(G * L.nc) * 4);
  L.mlast = take(G * 4);
  L.l = take(G * 4);
  // One space for the score partials [G][rows][2] (step 1), then the softmax warps' probabilities
  // [warps][64] (step 2).
  L.scratch = take(most(static_cast<size_t>(G * L.rows * 2) * 4, static_cast<size_t>(kWarpsT * kChunk) * 4));
  // Staging: first the block's score rows [rows][srow], then (same space) its PV lane slice of
  // every row [n][ks].
  L.srow = d + 8;
  L.stage = take(most(static_cast<size_t>(L.rows * L.srow) * 2, static_cast<size_t>(n * L.ks) * 2));
  L.total = o;
  return L;
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
// Rows are staged with asynchronous global -> shared copies (ops/cp_async.cuh: no register round
// trip, many in flight per thread); src_bytes = 0 writes zeros and reads nothing.

template <int C, int G, int T, int MinBlocks, int PB>
__global__ void __launch_bounds__(T, MinBlocks) sparse_attn_split_kernel(SparseAttnArgs a) {
  static_assert(G % 4 == 0 && C >= 2 && C <= 16 && T % 32 == 0 && (PB == 2 || PB == 4),
                "head groups of 4, at most 16 blocks per cluster");
  constexpr int kWarpsT = T / 32;
  dev::pdl_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char raw_smem[];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  // Remote blocks must be running before their shared memory is written: arrive now, wait before
  // the first remote store.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  const int64_t d = a.d;
  const SplitLayout L = split_layout<C, G, T, PB>(a.list_len, d);
  const int64_t n = L.n, nc = L.nc, R = L.rows, ks = L.ks;
  const uint16_t** rowptr = reinterpret_cast<const uint16_t**>(raw_smem + L.rowptr);
  float* q = reinterpret_cast<float*>(raw_smem + L.q);
  float* sc = reinterpret_cast<float*>(raw_smem + L.s);
  float* pbuf = reinterpret_cast<float*>(raw_smem + L.pb);  // PB == 4
  uint16_t* pbuf16 = reinterpret_cast<uint16_t*>(raw_smem + L.pb);  // PB == 2
  float* ccs = reinterpret_cast<float*>(raw_smem + L.cc);
  float* psums = reinterpret_cast<float*>(raw_smem + L.psum);
  float* mlast = reinterpret_cast<float*>(raw_smem + L.mlast);
  float* lden = reinterpret_cast<float*>(raw_smem + L.l);
  float* part = reinterpret_cast<float*>(raw_smem + L.scratch);  // step 1
  float* pscr = reinterpret_cast<float*>(raw_smem + L.scratch);  // step 2
  float* pvs = reinterpret_cast<float*>(raw_smem + L.s);         // step 3 (the scores are consumed)
  uint16_t* stage = reinterpret_cast<uint16_t*>(raw_smem + L.stage);
  const int d32 = static_cast<int>(d), n32 = static_cast<int>(n), R32 = static_cast<int>(R), ks32 = static_cast<int>(ks);

  const int rank = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.z, h0 = static_cast<int64_t>(blockIdx.y) * G;
  const int nh = static_cast<int>(a.heads - h0 < G ? a.heads - h0 : G);

  // The query's heads first (asynchronous, so their load overlaps the list's); a partial group's
  // other heads are zeros.
  {
    const float* qsrc = a.q + (t * a.heads + h0) * d;
    const int total = G * d32 / 4, valid = nh * d32 / 4;
    for (int i = tid; i < total; i += T)
      dev::cp_async16_zfill(q + 4 * i, i < valid ? qsrc + 4 * i : a.q, i < valid ? 16u : 0u);
  }
  const int32_t* list = a.list + t * a.list_len;
  const uint16_t* pool_a = a.pool_a[t];
  const uint16_t* pool_b = a.pool_b ? a.pool_b[t] : nullptr;
  for (int64_t j = tid; j < n; j += T) {
    const int32_t e = list[j];
    const uint16_t* r = nullptr;
    if (e >= 0 && e < a.split) r = pool_a ? pool_a + static_cast<int64_t>(e) * d : nullptr;
    else if (e >= a.split) r = pool_b ? pool_b + static_cast<int64_t>(e - a.split) * d : nullptr;
    rowptr[j] = r;
  }
  // The softmax tasks write the probabilities of heads < nh; a partial group's other heads are 0.
  if (nh < G)
    for (int i = tid; i < n32 * G; i += T)
      if (i % G >= nh) {
        if constexpr (PB == 4) pbuf[i] = 0.0f;
        else pbuf16[i] = 0;
      }
  __syncthreads();
  // Stage this block's score rows (coalesced 16-byte copies); skipped entries stay unread.
  {
    const int vpr = d32 / 8, total = R32 * vpr;
    for (int v = tid; v < total; v += T) {
      const int jj = v / vpr, vv = v % vpr, j = rank * R32 + jj;
      if (j >= n32) break;  // v grows with j
      const uint16_t* row = rowptr[j];
      if (row) dev::cp_async16_zfill(stage + jj * L.srow + vv * 8, row + vv * 8, 16u);
    }
  }
  dev::cp_async_wait_all();
  __syncthreads();

  // ---- 1. scores of rows [rank·R, rank·R + R): one thread per (head pair, K block, row), two
  // dot.h chains (one per head) sharing each loaded row vector.
  {
    const int64_t tasks = R * L.nblk * (G / 2);
    for (int64_t task = tid; task < tasks; task += T) {
      const int64_t jj = task % R, rest = task / R, b = rest % L.nblk, hp = rest / L.nblk;
      const int64_t j = rank * R + jj;
      if (j >= n || 2 * hp >= nh) continue;
      if (!rowptr[j]) continue;
      const uint16_t* row = stage + jj * L.srow;
      const int64_t k0 = b * dev::kGemmKBlock, k1 = k0 + dev::kGemmKBlock < d ? k0 + dev::kGemmKBlock : d;
      const float* qa = q + 2 * hp * d;
      const float* qb = qa + d;
      float acc0 = 0.0f, acc1 = 0.0f;
      for (int64_t k = k0; k < k1; k += 32) {
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (k + 8 * i < k1) v[i] = *reinterpret_cast<const uint4*>(row + k + 8 * i);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (k + 8 * i >= k1) break;
          const int64_t kk = k + 8 * i;
          const float4 a0 = *reinterpret_cast<const float4*>(qa + kk), a1 = *reinterpret_cast<const float4*>(qa + kk + 4);
          const float4 b0 = *reinterpret_cast<const float4*>(qb + kk), b1 = *reinterpret_cast<const float4*>(qb + kk + 4);
          const float xa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
          const float xb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
          const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x0 = bf16_lo(w[e]), x1 = bf16_hi(w[e]);
            acc0 = fmaf(xa[2 * e], x0, acc0);
            acc1 = fmaf(xb[2 * e], x0, acc1);
            acc0 = fmaf(xa[2 * e + 1], x1, acc0);
            acc1 = fmaf(xb[2 * e + 1], x1, acc1);
          }
        }
      }
      part[((2 * hp) * R + jj) * 2 + b] = acc0;
      part[((2 * hp + 1) * R + jj) * 2 + b] = acc1;
    }
  }
  __syncthreads();
  // The score rows are consumed: stage this block's PV lane slice of every row in the same space
  // (in flight during the score exchange and the softmax terms); skipped entries as zeros.
  const int64_t kbase = rank * ks, pairs = ks / 2;
  {
    const int kb32 = static_cast<int>(kbase);
    const int width = (d32 - kb32 < ks32 ? d32 - kb32 : ks32);  // lanes of this slice inside d
    // A 16-byte aligned global address inside the list's allocation; never read (0 source bytes).
    const void* dummy = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(a.list) & ~uintptr_t{15});
    if (width > 0) {
      if (ks32 % 8 == 0) {  // 16-byte pieces (kbase is then a multiple of 8 as well)
        const int vpr = width / 8;
        for (int v = tid; v < n32 * vpr; v += T) {
          const int j = v / vpr, vv = v % vpr;
          const uint16_t* row = rowptr[j];
          dev::cp_async16_zfill(stage + j * ks32 + vv * 8, row ? row + kb32 + vv * 8 : dummy, row ? 16u : 0u);
        }
      } else {  // 4-byte pieces (lane pairs)
        const int vpr = width / 2;
        for (int v = tid; v < n32 * vpr; v += T) {
          const int j = v / vpr, vv = v % vpr;
          const uint16_t* row = rowptr[j];
          dev::cp_async4_zfill(stage + j * ks32 + vv * 2, row ? row + kb32 + vv * 2 : dummy, row ? 4u : 0u);
        }
      }
    }
  }
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  // gemm_dot_f32's total (0 + block 0 + block 1), times the scale; -inf for a skipped entry. Every
  // block of the cluster gets the score.
  for (int64_t task = tid; task < G * R; task += T) {
    const int64_t h = task / R, jj = task % R, j = rank * R + jj;
    if (j >= n) continue;
    float sv = -INFINITY;
    if (h < nh && rowptr[j]) {
      float tot = __fadd_rn(0.0f, part[(h * R + jj) * 2]);
      if (L.nblk > 1) tot = __fadd_rn(tot, part[(h * R + jj) * 2 + 1]);
      sv = __fmul_rn(tot, a.scale);
    }
#pragma unroll
    for (int r = 0; r < C; ++r) cluster.map_shared_rank(sc, r)[h * n + j] = sv;
  }
  cluster.sync();

  // ---- 2. per (head, chunk), on warp task / C of block task % C: the running max before and after
  // the chunk, c, probabilities, psum; the results go to every block.
  for (int64_t task = rank + static_cast<int64_t>(C) * warp; task < nh * nc; task += static_cast<int64_t>(C) * kWarpsT) {
    const int64_t h = task / nc, c = task % nc, c0 = c * kChunk;
    const int cn = static_cast<int>(n - c0 < kChunk ? n - c0 : kChunk);
    const float* sh = sc + h * n;
    float before = -INFINITY, within = -INFINITY;
    for (int64_t j = lane; j < c0; j += 32) before = fmaxf(before, sh[j]);
    for (int j = lane; j < cn; j += 32) within = fmaxf(within, sh[c0 + j]);
    before = dev::warp_max(before);
    within = dev::warp_max(within);
    const float m = -1e30f < before ? before : -1e30f;
    const float m_new = m < within ? within : m;
    const float cval = dev::exp_ref(__fsub_rn(m, m_new));
    float* ps = pscr + warp * kChunk;
    for (int j = lane; j < cn; j += 32) {
      const float pj = dev::exp_ref(__fsub_rn(sh[c0 + j], m_new));
      ps[j] = pj;
      const float pbj = dev::bf16_round(pj);
      if constexpr (PB == 4) {
#pragma unroll
        for (int r = 0; r < C; ++r) cluster.map_shared_rank(pbuf, r)[(c0 + j) * G + h] = pbj;
      } else {
        const uint16_t bits = static_cast<uint16_t>(__float_as_uint(pbj) >> 16);
#pragma unroll
        for (int r = 0; r < C; ++r) cluster.map_shared_rank(pbuf16, r)[(c0 + j) * G + h] = bits;
      }
    }
    __syncwarp();
    const float psum = dev::warp_torch_sum([&](int64_t i) { return ps[i]; }, cn);
    if (lane < C) {
      cluster.map_shared_rank(ccs, lane)[h * nc + c] = cval;
      cluster.map_shared_rank(psums, lane)[h * nc + c] = psum;
      if (c == nc - 1) cluster.map_shared_rank(mlast, lane)[h] = m_new;
    }
    __syncwarp();
  }
  cluster.sync();
  if (tid < nh) {
    float l = 0.0f;
    for (int64_t c = 0; c < nc; ++c) l = __fadd_rn(__fmul_rn(l, ccs[tid * nc + c]), psums[tid * nc + c]);
    lden[tid] = __fadd_rn(l, dev::exp_ref(__fsub_rn(a.sink[h0 + tid], mlast[tid])));
  }

  dev::cp_async_wait_all();
  __syncthreads();
  // ---- 3. PV of each chunk for this block's d lanes [rank·ks, rank·ks + ks): one thread per (chunk,
  // lane pair), all heads; rows in list order (skipped entries add +0).
  for (int64_t task = tid; task < nc * pairs; task += T) {
    const int64_t c = task / pairs, k = kbase + 2 * (task % pairs), c0 = c * kChunk;
    if (k >= d) continue;
    const int cn = static_cast<int>(n - c0 < kChunk ? n - c0 : kChunk);
    float pv[G][2];
#pragma unroll
    for (int h = 0; h < G; ++h) pv[h][0] = pv[h][1] = 0.0f;
    const uint16_t* lanes = stage + (k - kbase);
    for (int j0 = 0; j0 < cn; j0 += 8) {
      uint32_t v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[i] = j0 + i < cn ? *reinterpret_cast<const uint32_t*>(lanes + (c0 + j0 + i) * ks) : 0u;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (j0 + i >= cn) break;
        float pbh[G];
        if constexpr (PB == 4) {
          const float4* p4 = reinterpret_cast<const float4*>(pbuf + (c0 + j0 + i) * G);
#pragma unroll
          for (int g = 0; g < G / 4; ++g) {
            const float4 x = p4[g];
            pbh[4 * g] = x.x, pbh[4 * g + 1] = x.y, pbh[4 * g + 2] = x.z, pbh[4 * g + 3] = x.w;
          }
        } else {
          const uint2* p2 = reinterpret_cast<const uint2*>(pbuf16 + (c0 + j0 + i) * G);
#pragma unroll
          for (int g = 0; g < G / 4; ++g) {
            const uint2 x = p2[g];
            pbh[4 * g] = bf16_lo(x.x), pbh[4 * g + 1] = bf16_hi(x.x), pbh[4 * g + 2] = bf16_lo(x.y), pbh[4 * g + 3] = bf16_hi(x.y);
          }
        }
        const float x0 = bf16_lo(v[i]), x1 = bf16_hi(v[i]);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          pv[h][0] = __fadd_rn(pv[h][0], __fmul_rn(pbh[h], x0));
          pv[h][1] = __fadd_rn(pv[h][1], __fmul_rn(pbh[h], x1));
        }
      }
    }
    const int64_t kk = k - kbase;
#pragma unroll
    for (int h = 0; h < G; ++h) {
      pvs[(c * G + h) * ks + kk] = pv[h][0];
      pvs[(c * G + h) * ks + kk + 1] = pv[h][1];
    }
  }
  __syncthreads();
  // ---- acc = acc·c + pv over the chunks in order; out = bf16(acc / l).
  for (int64_t task = tid; task < nh * ks; task += T) {
    const int64_t h = task / ks, kk = task % ks, k = kbase + kk;
    if (k >= d) continue;
    float acc = 0.0f;
    for (int64_t c = 0; c < nc; ++c) acc = __fadd_rn(__fmul_rn(acc, ccs[h * nc + c]), pvs[(c * G + h) * ks + kk]);
    a.out[(t * a.heads + h0 + h) * d + k] = dev::bf16_round(__fdiv_rn(acc, lden[h]));
  }
#endif
}

#include "ops/sparse_attn_tiled.cuh"

// One split variant: cluster size C, G heads per cluster, T threads per block, MinBlocks per SM, PB
// bytes per staged probability.
template <int C, int G, int T, int MinBlocks, int PB>
struct SplitVariant {
  static constexpr void (*fn)(SparseAttnArgs) = sparse_attn_split_kernel<C, G, T, MinBlocks, PB>;
  static size_t smem(const SparseAttnArgs& a) { return split_layout<C, G, T, PB>(a.list_len, a.d).total; }
  static bool shape_ok(const SparseAttnArgs& a) {
    return a.list_len >= 1 && a.list_len <= kSplitMaxList && a.d >= 8 && a.d <= 512 && a.d % 8 == 0 && a.n_q <= 65535 &&
           (a.heads + G - 1) / G <= 65535 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0;
  }
  static cudaLaunchConfig_t config(const SparseAttnArgs& a, size_t smem_bytes, cudaStream_t s, cudaLaunchAttribute* attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(C, static_cast<unsigned>((a.heads + G - 1) / G), static_cast<unsigned>(a.n_q < 1 ? 1 : a.n_q));
    cfg.blockDim = dim3(T);
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
  }
  // Per device, once (the first launch, outside any graph capture in practice): cluster support,
  // the shared-memory opt-in raised to the largest supported layout and the non-portable cluster
  // size where C > 8 (no occupancy query here: it is not allowed inside a stream capture). ok =
  // false where the device cannot run this variant.
  static cudaError_t ready(bool& ok, size_t* raised = nullptr) {
    static int state[64] = {};        // 0 unknown, 1 ready, -1 not on this device
    static size_t limit[64] = {};     // the dynamic shared memory raised to (list lengths beyond it refused)
    ok = false;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 0 || dev >= 64) return cudaSuccess;
    if (state[dev] == 0) {
      int v = 0;
      e = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev);
      if (e != cudaSuccess) return e;
      state[dev] = -1;
      SparseAttnArgs big;
      big.list_len = kSplitMaxList;
      big.d = 512;
      big.heads = G;
      big.n_q = 1;
      // all the longest list needs, or all the device gives a block where that is less (GB10)
      const size_t want = std::min(smem(big), max_dynamic_smem(fn));
      if (v && want > 0 && raise_dynamic_smem(fn, want) == cudaSuccess &&
          (C <= 8 || cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess)) {
        // Several blocks per SM need the largest shared-memory carveout (a hint; refusal is harmless).
        if (MinBlocks > 1) (void)cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        state[dev] = 1;
        limit[dev] = want;
      }
      (void)cudaGetLastError();  // a refused attribute or query leaves nothing behind
    }
    ok = state[dev] > 0;
    if (raised) *raised = limit[dev];
    return cudaSuccess;
  }
  static cudaError_t launch(const SparseAttnArgs& a, cudaStream_t s) {
    if (a.n_q == 0) return cudaSuccess;
    if (!shape_ok(a)) return cudaErrorNotSupported;
    bool ok = false;
    size_t raised = 0;
    cudaError_t e = ready(ok, &raised);
    if (e != cudaSuccess) return e;
    if (!ok || smem(a) > raised) return cudaErrorNotSupported;
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = config(a, smem(a), s, attr);
    cfg.numAttrs = add_pdl_attribute(attr, 1);  // programmatic dependent launch, as launch_pdl
    e = cudaLaunchKernelEx(&cfg, fn, a);
    if (e != cudaSuccess && cfg.numAttrs > 1) {  // a stream or driver that rejects PDL with clusters
      (void)cudaGetLastError();
      cfg.numAttrs = 1;
      e = cudaLaunchKernelEx(&cfg, fn, a);
    }
    return e;
  }
  static int max_clusters(const SparseAttnArgs& a) {
    bool ok = false;
    size_t raised = 0;
    if (!shape_ok(a) || ready(ok, &raised) != cudaSuccess || !ok || smem(a) > raised) return 0;
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = config(a, smem(a), nullptr, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return clusters;
  }
};

// Variant 0: clusters of 8 blocks of 512 threads, 4 heads (one SM per block; 16 clusters of 8 for
// 64 heads). 1: 16 blocks of 256 threads, 4 heads (half the rows and lanes per block, two blocks per
// SM). 2: 8 blocks of 256 threads, 4 heads, bf16 probabilities (two blocks per SM at the decode
// list of 640, so all 16 clusters of one query may be resident at once). Clusters must fit inside
// one GPC, so how many are resident at once decides the waves per call.
using SplitV0 = SplitVariant<8, 4, 512, 1, 4>;
using SplitV1 = SplitVariant<16, 4, 256, 2, 4>;
using SplitV2 = SplitVariant<8, 4, 256, 2, 2>;
constexpr int kSplitVariants = 3;
const char* const kSplitVariantNames[kSplitVariants] = {"c8-h4-t512", "c16-h4-t256", "c8-h4-t256-pb16"};

cudaError_t split_launch(const SparseAttnArgs& a, int v, cudaStream_t s) {
  switch (v) {
    case 0: return SplitV0::launch(a, s);
    case 1: return SplitV1::launch(a, s);
    case 2: return SplitV2::launch(a, s);
    default: return cudaErrorNotSupported;
  }
}

// One tiled form for a's shape: cudaErrorNotSupported, nothing launched, where the shape or the
// device's shared memory does not allow it. The opt-in is raised once to the form's largest layout
// (d = 512), or to all the device gives a block where that is less, so launches inside a graph
// capture never change it.
template <class Sh>
cudaError_t tiled_launch(const SparseAttnArgs& a, cudaStream_t s) {
  if (a.n_q == 0) return cudaSuccess;
  constexpr int H = Sh::kHeads;
  if (a.d < 8 || a.d > kTiledMaxD || a.d % 8 != 0 || a.n_q > 0x7fffffff || (a.heads + H - 1) / H > 65535 ||
      reinterpret_cast<uintptr_t>(a.q) % 16 != 0)
    return cudaErrorNotSupported;
  static int configured[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64) return cudaErrorNotSupported;
  const size_t most = max_dynamic_smem(sparse_attn_tiled_kernel<Sh>), smem = tiled_layout<Sh>(a.d).total;
  if (smem > most) return cudaErrorNotSupported;
  const int want = static_cast<int>(std::min(tiled_layout<Sh>(kTiledMaxD).total, most));
  if (configured[dev] < want) {
    e = raise_dynamic_smem(sparse_attn_tiled_kernel<Sh>, static_cast<size_t>(want));
    if (e != cudaSuccess) return e;
    configured[dev] = want;
  }
  const dim3 grid(static_cast<unsigned>(a.n_q), static_cast<unsigned>((a.heads + H - 1) / H));
  launch_pdl(sparse_attn_tiled_kernel<Sh>, grid, Sh::kThreads, smem, s, a);
  return cudaGetLastError();
}

}  // namespace

namespace raw {
cudaError_t sparse_attention_rows(const SparseAttnArgs& a, int heads_per_block, cudaStream_t s) {
  if (a.n_q == 0) return cudaSuccess;
  // The shared-memory opt-in is a function attribute, not a stream operation: raise it once to the
  // largest layout the validated callers use (d <= 512, 4 heads per block), so launches inside a
  // graph capture never need it; a larger request raises it again.
  static int configured[64] = {};  // per device
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const size_t smem = smem_bytes(a.d, heads_per_block), most = max_dynamic_smem(sparse_attn_kernel);
  if (smem > most) return cudaErrorInvalidValue;  // more than the device gives a block
  const int want = static_cast<int>(std::min(std::max(smem, smem_bytes(512, 4)), most));
  if (dev < 0 || dev >= 64 || configured[dev] < want) {
    e = raise_dynamic_smem(sparse_attn_kernel, static_cast<size_t>(want));
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64) configured[dev] = want;
  }
  const dim3 grid(static_cast<unsigned>(a.n_q), static_cast<unsigned>((a.heads + heads_per_block - 1) / heads_per_block));
  launch_pdl(sparse_attn_kernel, grid, kThreads, smem, s, a, heads_per_block);
  return cudaGetLastError();
}

// The split variant for n_q queries. bench_gpu_attention on the H200, us per call at 640 entries
// (variants 0 / 1 / 2): 1 query 34.5 / 38.9 / 28.5, 2 queries 52.2 / 62.3 / 52.5, 4 queries
// 87.1 / 104.0 / 81.1; 128 entries: 20.9 / 23.2 / 12.9. Variant 2 everywhere; variants 1, then 0,
// where the device refuses it (sparse_attention_split falls back).
int split_choice(int64_t /*n_q*/) { return 2; }

// A variant the device refuses (its layout beyond the shared memory a block gets, as for the decode
// list of 640 in clusters of 8 on GB10's 99 KB, or clusters of 16) falls back to the others: the
// cluster of 16 stages half the rows a block.
cudaError_t sparse_attention_split(const SparseAttnArgs& a, cudaStream_t s) {
  const int v = split_choice(a.n_q);
  cudaError_t e = split_launch(a, v, s);
  for (const int w : {1, 0})
    if (e == cudaErrorNotSupported && v != w) e = split_launch(a, w, s);
  return e;
}
size_t sparse_attention_split_smem(const SparseAttnArgs& a, int v) {
  switch (v) {
    case 0: return SplitV0::smem(a);
    case 1: return SplitV1::smem(a);
    case 2: return SplitV2::smem(a);
    default: return 0;
  }
}

int sparse_attention_split_variants() { return kSplitVariants; }
const char* sparse_attention_split_variant_name(int v) { return v >= 0 && v < kSplitVariants ? kSplitVariantNames[v] : "?"; }
cudaError_t sparse_attention_split_variant(const SparseAttnArgs& a, int v, cudaStream_t s) { return split_launch(a, v, s); }
int sparse_attention_split_max_clusters(const SparseAttnArgs& a, int v) {
  switch (v) {
    case 0: return SplitV0::max_clusters(a);
    case 1: return SplitV1::max_clusters(a);
    case 2: return SplitV2::max_clusters(a);
    default: return 0;
  }
}

cudaError_t sparse_attention_tiled(const SparseAttnArgs& a, cudaStream_t s) {
  // The wide form where it fits the device, else the narrow one (GB10 at d = 512).
  const cudaError_t e = tiled_launch<TiledWide>(a, s);
  return e == cudaErrorNotSupported ? tiled_launch<TiledNarrow>(a, s) : e;
}
int sparse_attention_tiled_variants() { return 2; }
cudaError_t sparse_attention_tiled_variant(const SparseAttnArgs& a, int v, cudaStream_t s) {
  return v == 0 ? tiled_launch<TiledWide>(a, s) : v == 1 ? tiled_launch<TiledNarrow>(a, s) : cudaErrorNotSupported;
}
size_t sparse_attention_tiled_variant_smem(int64_t d, int v) {
  return v == 0 ? tiled_layout<TiledWide>(d).total : v == 1 ? tiled_layout<TiledNarrow>(d).total : 0;
}

// Few queries: the split kernel (one query's list spread over a cluster); many queries (prefill
// passes): the tiled kernel (all heads of a group per chunk at once). The rows kernel with
// `heads_per_block` heads per block serves shapes neither takes.
cudaError_t sparse_attention(const SparseAttnArgs& a, int heads_per_block, cudaStream_t s) {
  if (a.n_q > 0 && a.n_q <= kSplitMaxQueries) {
    const cudaError_t e = sparse_attention_split(a, s);
    if (e != cudaErrorNotSupported) return e;
  }
  const cudaError_t e = sparse_attention_tiled(a, s);
  if (e != cudaErrorNotSupported) return e;
  return sparse_attention_rows(a, heads_per_block, s);
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
