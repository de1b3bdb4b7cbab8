// Sparse attention for many queries (prefill passes): one block per query and group of H heads,
// every head of the group computed at once per 64-entry chunk, register-tiled. Two forms
// (TiledShape): 32 heads with two chunk buffers (the next chunk's rows copied while this one is
// computed; 220 KB at d = 512, the H200's), and 8 heads with one buffer (90 KB at d = 512, which
// GB10's 99 KB a block holds; its blocks re-stage each chunk's rows per 8 heads and copy without
// overlap). Both run the same chains in the same order: the same bits.
// Included by sparse_attn.cu (inside its anonymous namespace, after kChunk; copies: ops/cp_async.cuh).
//
// Per chunk the reference runs, per head, three steps; here each is one block-wide phase:
//  1. scores: the dot.h chains (one fma chain from zero per 256-wide K block, q·row in K order).
//     These are H heads x 64 entries x 2 blocks (4096 at H = 32) independent chains; each of the
//     8·H threads walks 16 of them side by side (4 heads x 4 entries of one K block), so every
//     staged row vector and every q vector it loads feeds 4 chains. The block totals are added as gemm_dot_f32 does
//     (0 + block 0 + block 1), times the scale; a skipped entry scores -inf.
//  2. softmax terms (one warp per head, as the rows kernel): max, c = exp(m - m'), fp32
//     probabilities, their torch_sum, l = l·c + psum, bf16-rounded probabilities for PV.
//  3. PV: pv = sum over the chunk's entries in list order of bf16(p)·row (a product rounded, then
//     added: no fma), then acc = acc·c + pv. A thread owns 8 heads x 8 d lanes for the whole kernel
//     (acc stays in registers), so each staged row vector feeds 8 heads.
// Entries that are skipped (-1, a missing pool) or past the list's end are staged as zero rows
// with probability +0: their PV term is +0·row = +0, and pv + (+0) == pv for every pv the chain
// can hold (it starts at +0 and a round-to-nearest sum is never -0 unless both addends are), so
// running them through the chain is the reference's "skip". With two buffers the rows of chunk c+1
// are copied (cp.async, zero-filling skipped rows) while chunk c is computed.
constexpr int64_t kTiledMaxD = 512;

// H heads a block (a multiple of 8: the PV threads own 8 heads each), B chunk buffers (1 or 2);
// 8·H threads (PV: H/8 head groups x 64 lane groups; scores: 2 K blocks x H/4 head quads x 16).
template <int H, int B>
struct TiledShape {
  static constexpr int kHeads = H, kBuffers = B, kThreads = 8 * H;
  static_assert(H % 8 == 0 && H >= 8 && H <= 32 && (B == 1 || B == 2));
};
using TiledWide = TiledShape<32, 2>;    // the H200's form
using TiledNarrow = TiledShape<8, 1>;   // fits GB10's 99 KB at d = 512

struct TiledLayout {
  int64_t qs, rs;  // q row stride (floats), staged row stride (bf16 values); padded off bank 0
  size_t q, rows, part, pb, valid, ml, cvec, lfin, total;  // byte offsets
};

template <class Sh>
__host__ __device__ inline TiledLayout tiled_layout(int64_t d) {
  constexpr int kTiledHeads = Sh::kHeads;
  TiledLayout L;
  L.qs = d + 4;
  L.rs = d + 8;
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o += (bytes + 15) / 16 * 16;
    return at;
  };
  L.q = take(static_cast<size_t>(kTiledHeads * L.qs) * 4);
  L.rows = take(static_cast<size_t>(Sh::kBuffers * kChunk * L.rs) * 2);  // the chunk buffers
  L.part = take(static_cast<size_t>(2 * kTiledHeads * kChunk) * 4);  // [K block][head][entry]; p reuses block 0
  L.pb = take(static_cast<size_t>(kTiledHeads * kChunk) * 4);        // [head][entry] bf16-rounded p
  L.valid = take(static_cast<size_t>(Sh::kBuffers * kChunk) * 4);    // [buffer][entry]
  L.ml = take(static_cast<size_t>(2 * kTiledHeads) * 4);             // [head]: running max, denominator
  L.cvec = take(static_cast<size_t>(kTiledHeads) * 4);               // [head]: this chunk's c
  L.lfin = take(static_cast<size_t>(kTiledHeads) * 4);               // [head]: final denominator
  L.total = o;
  return L;
}

// Copies entry j of chunk [c0, c0 + 64) of query t's list into a staged buffer, as worker `sub` of
// the entry's 4 (each takes every 4th 16-byte piece of the row); valid[j] = 1 for an entry with a row.
__device__ __forceinline__ void tiled_stage_entry(const SparseAttnArgs& a, int64_t t, int64_t c0, uint16_t* buf,
                                                  float* valid, int64_t rs, int j, int sub) {
  const uint16_t* row = nullptr;
  if (c0 + j < a.list_len) {
    const int32_t e = a.list[t * a.list_len + c0 + j];
    const uint16_t* pool_a = a.pool_a[t];
    const uint16_t* pool_b = a.pool_b ? a.pool_b[t] : nullptr;
    if (e >= 0 && e < a.split) row = pool_a ? pool_a + static_cast<int64_t>(e) * a.d : nullptr;
    else if (e >= a.split) row = pool_b ? pool_b + static_cast<int64_t>(e - a.split) * a.d : nullptr;
  }
  const int vpr = static_cast<int>(a.d / 8);
  // A 16-byte aligned global address inside the list's allocation; never read (0 source bytes).
  const void* dummy = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(a.list) & ~uintptr_t{15});
  for (int v = sub; v < vpr; v += 4)
    dev::cp_async16_zfill(buf + j * rs + v * 8, row ? row + v * 8 : dummy, row ? 16u : 0u);
  if (sub == 0) valid[j] = row ? 1.0f : 0.0f;
}
// The whole chunk: 4 workers per entry, dealt over the block's T threads.
template <int T>
__device__ __forceinline__ void tiled_stage_chunk(const SparseAttnArgs& a, int64_t t, int64_t c0, uint16_t* buf,
                                                  float* valid, int64_t rs) {
  static_assert(4 * kChunk % T == 0);
#pragma unroll
  for (int w = threadIdx.x; w < 4 * kChunk; w += T) tiled_stage_entry(a, t, c0, buf, valid, rs, w >> 2, w & 3);
}

template <class Sh>
__global__ void __launch_bounds__(Sh::kThreads, 1) sparse_attn_tiled_kernel(SparseAttnArgs a) {
  constexpr int kTiledHeads = Sh::kHeads, kTiledThreads = Sh::kThreads;
  dev::pdl_enter();
  extern __shared__ __align__(16) unsigned char raw_smem[];
  const int64_t d = a.d;
  const TiledLayout L = tiled_layout<Sh>(d);
  float* qsm = reinterpret_cast<float*>(raw_smem + L.q);
  uint16_t* rows = reinterpret_cast<uint16_t*>(raw_smem + L.rows);
  float* part = reinterpret_cast<float*>(raw_smem + L.part);
  float* pbs = reinterpret_cast<float*>(raw_smem + L.pb);
  float* valid = reinterpret_cast<float*>(raw_smem + L.valid);
  float* ml = reinterpret_cast<float*>(raw_smem + L.ml);
  float* cvec = reinterpret_cast<float*>(raw_smem + L.cvec);
  float* lfin = reinterpret_cast<float*>(raw_smem + L.lfin);
  const int64_t qs = L.qs, rs = L.rs;
  const int d32 = static_cast<int>(d);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kTiledHeads;
  const int nh = static_cast<int>(a.heads - h0 < kTiledHeads ? a.heads - h0 : kTiledHeads);
  const int nblk = (d32 + dev::kGemmKBlock - 1) / dev::kGemmKBlock;  // 1 or 2
  const int64_t nc = (a.list_len + kChunk - 1) / kChunk;

  if (nc > 0) tiled_stage_chunk<kTiledThreads>(a, t, 0, rows, valid, rs);
  dev::cp_async_commit();
  {  // q of the group's heads (zero for heads past the end: their results are never stored)
    const float4* src = reinterpret_cast<const float4*>(a.q + (t * a.heads + h0) * d);
    const int vpr = d32 / 4;
    for (int i = tid; i < kTiledHeads * vpr; i += kTiledThreads) {
      const int h = i / vpr, v = i % vpr;
      const float4 x = h < nh ? src[h * vpr + v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      *reinterpret_cast<float4*>(qsm + h * qs + 4 * v) = x;
    }
  }
  if (tid < kTiledHeads) {
    ml[2 * tid] = -1e30f;
    ml[2 * tid + 1] = 0.0f;
  }

  // PV ownership: heads ph0..ph0+7, d lanes pk0..pk0+7 (H / 8 head groups of 64 threads).
  const int ph0 = (tid >> 6) * 8, pk0 = (tid & 63) * 8;
  const bool pv_active = pk0 < d32;
  float acc[8][8];
#pragma unroll
  for (int h = 0; h < 8; ++h)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[h][k] = 0.0f;

  // Score ownership: K block sh, heads sh0+0..3, entries se0 + 16·i (each K block's half of the
  // threads: H / 4 head quads x 16).
  constexpr int kHalf = kTiledThreads / 2;
  const int sh = tid / kHalf, sh0 = ((tid % kHalf) >> 4) * 4, se0 = tid & 15;

  for (int64_t c = 0; c < nc; ++c) {
    const int64_t c0 = c * kChunk;
    const int cn = static_cast<int>(a.list_len - c0 < kChunk ? a.list_len - c0 : kChunk);
    const int buf = Sh::kBuffers == 2 ? static_cast<int>(c & 1) : 0;
    const uint16_t* cur = rows + buf * kChunk * rs;
    const float* vcur = valid + buf * kChunk;
    __syncthreads();  // chunk c-1's PV is done with the other buffer (with one: with this one)
    if constexpr (Sh::kBuffers == 2) {
      if (c + 1 < nc) {
        uint16_t* next = rows + (buf ^ 1) * kChunk * rs;
        tiled_stage_chunk<kTiledThreads>(a, t, c0 + kChunk, next, valid + (buf ^ 1) * kChunk, rs);
        dev::cp_async_commit();
        dev::cp_async_wait<1>();
      } else {
        dev::cp_async_wait<0>();
      }
    } else {
      if (c > 0) {
        tiled_stage_chunk<kTiledThreads>(a, t, c0, rows, valid, rs);
        dev::cp_async_commit();
      }
      dev::cp_async_wait<0>();
    }
    __syncthreads();

    // ---- 1. score chains
    if (sh < nblk) {
      const int k0 = sh * dev::kGemmKBlock, k1 = k0 + dev::kGemmKBlock < d32 ? k0 + dev::kGemmKBlock : d32;
      float s[4][4];
#pragma unroll
      for (int h = 0; h < 4; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[h][e] = 0.0f;
      const float* qh = qsm + sh0 * qs;
      const uint16_t* re = cur + se0 * rs;
#pragma unroll 2
      for (int k = k0; k < k1; k += 8) {
        uint4 rv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) rv[e] = *reinterpret_cast<const uint4*>(re + (16 * e) * rs + k);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float4 qv[4];
#pragma unroll
          for (int h = 0; h < 4; ++h) qv[h] = *reinterpret_cast<const float4*>(qh + h * qs + k + 4 * half);
          float x[4][4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const uint32_t w0 = half ? rv[e].z : rv[e].x, w1 = half ? rv[e].w : rv[e].y;
            x[e][0] = bf16_lo(w0);
            x[e][1] = bf16_hi(w0);
            x[e][2] = bf16_lo(w1);
            x[e][3] = bf16_hi(w1);
          }
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            const float qq[4] = {qv[h].x, qv[h].y, qv[h].z, qv[h].w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
              for (int e = 0; e < 4; ++e) s[h][e] = fmaf(qq[i], x[e][i], s[h][e]);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 4; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[(sh * kTiledHeads + sh0 + h) * kChunk + se0 + 16 * e] = s[h][e];
    }
    __syncthreads();

    // ---- 2. softmax terms, one warp per head
    for (int h = warp; h < kTiledHeads; h += kTiledThreads / 32) {
      float* ph = part + h * kChunk;  // block-0 partials, then this head's fp32 probabilities
      float sv[2];
      float mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = lane + 32 * r;
        sv[r] = -INFINITY;
        if (j < cn && vcur[j] != 0.0f) {
          float tot = __fadd_rn(0.0f, ph[j]);
          if (nblk > 1) tot = __fadd_rn(tot, part[(kTiledHeads + h) * kChunk + j]);
          sv[r] = __fmul_rn(tot, a.scale);
          mx = mx < sv[r] ? sv[r] : mx;
        }
      }
      mx = dev::warp_max(mx);
      const float m = ml[2 * h];
      const float m_new = m < mx ? mx : m;
      const float cval = dev::exp_ref(__fsub_rn(m, m_new));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = lane + 32 * r;
        float pj = 0.0f;
        if (j < cn) pj = dev::exp_ref(__fsub_rn(sv[r], m_new));
        ph[j] = pj;
        pbs[h * kChunk + j] = j < cn && vcur[j] != 0.0f ? dev::bf16_round(pj) : 0.0f;
      }
      __syncwarp();
      const float psum = dev::warp_torch_sum([&](int64_t i) { return ph[i]; }, cn);
      if (lane == 0) {
        ml[2 * h + 1] = __fadd_rn(__fmul_rn(ml[2 * h + 1], cval), psum);
        ml[2 * h] = m_new;
        cvec[h] = cval;
      }
    }
    __syncthreads();

    // ---- 3. PV in list order, then acc·c + pv
    if (pv_active) {
      float pv[8][8];
#pragma unroll
      for (int h = 0; h < 8; ++h)
#pragma unroll
        for (int k = 0; k < 8; ++k) pv[h][k] = 0.0f;
      const int cn4 = (cn + 3) & ~3;  // entries past cn are zero rows with p = +0
      const uint16_t* col = cur + pk0;
      const float* pbh = pbs + ph0 * kChunk;
      for (int j0 = 0; j0 < cn4; j0 += 4) {
        uint4 rv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) rv[i] = *reinterpret_cast<const uint4*>(col + (j0 + i) * rs);
        float4 p4[8];
#pragma unroll
        for (int h = 0; h < 8; ++h) p4[h] = *reinterpret_cast<const float4*>(pbh + h * kChunk + j0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t w[4] = {rv[i].x, rv[i].y, rv[i].z, rv[i].w};
          float x[8];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            x[2 * u] = bf16_lo(w[u]);
            x[2 * u + 1] = bf16_hi(w[u]);
          }
#pragma unroll
          for (int h = 0; h < 8; ++h) {
            const float p = i == 0 ? p4[h].x : i == 1 ? p4[h].y : i == 2 ? p4[h].z : p4[h].w;
#pragma unroll
            for (int k = 0; k < 8; ++k) pv[h][k] = __fadd_rn(pv[h][k], __fmul_rn(p, x[k]));
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        const float cc = cvec[ph0 + h];
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[h][k] = __fadd_rn(__fmul_rn(acc[h][k], cc), pv[h][k]);
      }
    }
  }
  __syncthreads();
  if (tid < nh) lfin[tid] = __fadd_rn(ml[2 * tid + 1], dev::exp_ref(__fsub_rn(a.sink[h0 + tid], ml[2 * tid])));
  __syncthreads();
  if (pv_active) {
#pragma unroll
    for (int h = 0; h < 8; ++h) {
      if (ph0 + h >= nh) break;
      const float l = lfin[ph0 + h];
      float* o = a.out + (t * a.heads + h0 + ph0 + h) * d + pk0;
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = dev::bf16_round(__fdiv_rn(acc[h][k], l));
    }
  }
}
