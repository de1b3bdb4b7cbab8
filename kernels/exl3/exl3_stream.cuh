// Persistent stream-K kernels of the small-m linear paths (int8: m <= 4, f16: m <= 8).
//
// Work is cut into units of one 128-column group x 128 k-rows (8 k-tiles per warp, one cp.async
// group), numbered column-group-major. A grid of about one wave of blocks takes contiguous unit
// ranges, so a block walks down one column group (accumulating in registers) and crosses into the
// next: each warp's trellis ring keeps streaming across unit and column-group boundaries, and the
// pipeline fills once per kernel instead of once per block. A column group that a block covers
// whole is finished directly; one shared by several (consecutive) blocks is summed from their
// partials in block order by the last to arrive, so results are bitwise repeatable.
//
// x is staged once per call by stage_int8_kernel / stage_f16_kernel (exl3_gemm.cu) straight into
// the mma B-fragment order; a block streams each unit's fragments through a shared cp.async ring
// of the same depth as the trellis ring (one block barrier per unit). The int8 path quantises per
// 128-row chunk (= per unit), so its scale flush happens at unit boundaries.
//
// A batched call (several matrices of one shape and kind, each with its own x and outputs) numbers
// the units of matrix i after those of matrix i - 1, so one grid streams all of them.
//
// The grouped MoE layer's stream path (exl3_moe.h) runs the same body over the experts the routing
// selected (moe_stream_kernel): its matrices come from the slot table every block builds from the
// top-k ids, and its column groups end in hooks of the MoE (moe_finish) instead of plain stores.
//
// Both kernels take part in programmatic dependent launch: the stream kernel prefetches its first
// trellis groups before waiting for the staging kernel, so its launch and pipeline fill overlap
// the staging. On a plain launch griddepcontrol is a no-op.
#pragma once
#include <type_traits>

#include "exl3/exl3_moe_kernel.cuh"

namespace dsv41::exl3::dev {

// Pure register mma forms (no volatile) so the compiler may schedule the x loads around them.
__device__ __forceinline__ void mma_u8s8_nv(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16_nv(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- unit ranges ---------------------------------------------------------------------------
// Block b owns units [unit_begin(b), unit_begin(b + 1)); block_of_unit inverts that.
__host__ __device__ __forceinline__ int unit_begin(int b, int total, int grid) {
  return static_cast<int>(static_cast<long long>(b) * total / grid);
}
__host__ __device__ __forceinline__ int block_of_unit(int u, int total, int grid) {
  return static_cast<int>(((static_cast<long long>(u) + 1) * grid + total - 1) / total) - 1;
}

// ---- x staging: one warp stages token r of one 128-row chunk --------------------------------
// Position o (0..15) inside a k-tile -> (lane group tig, fragment register i) of the B operand:
// register i of lane (g, tig) holds k-offset 2*tig + {0, 8, 1, 9}[i] (int8, m16n8k32 with one
// weight per 4 k-slots) or halves {2*tig, 2*tig+1} / {2*tig+8, 2*tig+9} (f16, m16n8k16).
__device__ __forceinline__ void frag_slot(int o, int& tig, int& i) {
  tig = (o & 7) >> 1;
  i = (o >= 8 ? 1 : 0) + ((o & 1) ? 2 : 0);
}

// int8 path: v (rows chunk·128 + 4·lane + e of x_had, zeros for tokens past m) quantised to two
// int8 levels hi + lo/254 relative to the chunk's amax/127, written as splatted B fragments
// [k/16][32 lanes] uint4 (lane 4·(2r + level) + tig); qstats[chunk·4 + r] = {kMul1Inv·s,
// kMul1Off·s·(sum hi + sum lo / 254)} with s = amax / 127. r < 4.
__device__ __forceinline__ void stage_int8_warp(const float (&v)[4], int r, int chunk, uint32_t* frag,
                                                float2* qstats) {
  const int lane = threadIdx.x & 31;
  float mx = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  int sum_hi = 0, sum_lo = 0;
  const int kt = chunk * 8 + (lane >> 2);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float a = v[e] * inv;
    const float hi = fminf(fmaxf(rintf(a), -127.0f), 127.0f);
    const float lo = fminf(fmaxf(rintf((a - hi) * 254.0f), -127.0f), 127.0f);
    const int hv = static_cast<int>(hi), lv = static_cast<int>(lo);
    sum_hi += hv;
    sum_lo += lv;
    int tig, i;
    frag_slot(4 * (lane & 3) + e, tig, i);
    uint32_t* base = frag + static_cast<size_t>(kt) * 128;  // 32 lanes x 4 words
    base[(4 * (2 * r) + tig) * 4 + i] = (static_cast<uint32_t>(hv) & 0xFFu) * 0x01010101u;
    base[(4 * (2 * r + 1) + tig) * 4 + i] = (static_cast<uint32_t>(lv) & 0xFFu) * 0x01010101u;
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    sum_hi += __shfl_xor_sync(0xFFFFFFFFu, sum_hi, o);
    sum_lo += __shfl_xor_sync(0xFFFFFFFFu, sum_lo, o);
  }
  if (lane == 0) {
    const float s = mx / 127.0f;
    qstats[chunk * 4 + r] =
        make_float2(kMul1Inv * s, kMul1Off * s * (static_cast<float>(sum_hi) + static_cast<float>(sum_lo) / 254.0f));
  }
}

// f16 path: v as fp16 B fragments [k/16][32] uint2 (lane 4·r + tig). r < 8.
__device__ __forceinline__ void stage_f16_warp(const float (&v)[4], int r, int chunk, __half* frag) {
  const int lane = threadIdx.x & 31;
  const int kt = chunk * 8 + (lane >> 2);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int o = 4 * (lane & 3) + e;
    const int tig = (o & 7) >> 1, word = o >> 3, half = o & 1;
    frag[(static_cast<size_t>(kt) * 32 + 4 * r + tig) * 4 + word * 2 + half] = __float2half_rn(v[e]);
  }
}

// A unit's place (matrix, column group of it, 128-row chunk kc), stepped one unit at a time: the
// kernels walk their units in order, and a division by a run-time value costs some twenty
// instructions, several a unit, against about 240 of decode work a warp does per unit.
struct UnitPos {
  int mat, ng, kc;
  __device__ __forceinline__ void init(int u, int U, int ngroups) {
    kc = u % U;
    const int gg = u / U;
    mat = gg / ngroups;
    ng = gg - mat * ngroups;
  }
  __device__ __forceinline__ void next(int U, int ngroups) {
    if (++kc == U) {
      kc = 0;
      if (++ng == ngroups) {
        ng = 0;
        ++mat;
      }
    }
  }
};

constexpr int kStreamRedBytes = 8 * 128 * 4;
// x fragment bytes per lane and k-tile: int8 uint4 (16 B), f16 uint2 (8 B).
__host__ __device__ constexpr int stream_frag_bytes(bool int8) { return int8 ? 16 : 8; }
// Trellis ring (per warp) + x ring (shared by the block, same depth) + reduction rows.
__host__ __device__ constexpr int stream_smem_bytes(int K, bool int8) {
  return ring_bytes(K) + ring_groups(K) * kGroup * 32 * stream_frag_bytes(int8) + kStreamRedBytes;
}

// ---- the stream kernel ---------------------------------------------------------------------
struct StreamArgs {
  cuda::Exl3Matrix w;
  const void* xfrag;     // staged x (see the staging kernels)
  const float2* qstats;  // int8: [k/128][4]
  void* y;
  int y_type;
  int64_t y_cols, y_stride;
  int m;
  bool round_bf16;
  int units_per_group;  // k / 128
  float* part;          // [grid][2][8][128]
  int* counters;        // [batch][n / 128]
  // A batched call (GemmParams::batch): matrix i's units follow matrix i - 1's; its trellis, svh and
  // bias come from ws[i], its staged x and int8 statistics from the i-th slices, its outputs go to
  // y + i·y_batch_stride.
  int batch;
  const cuda::Exl3Matrix* ws;
  size_t xfrag_batch_bytes;
  int64_t y_batch_stride;
};

// The MoE stream path: one projection (gate/up or down) of the experts the routing selected.
// s.w is the shape, bits and codebook every matrix of the projection shares (s.batch, s.ws unused);
// matrix 2·slot + proj (gate/up, proj 1 = up) or slot (down) of the slot table (build_slots).
struct MoeStreamArgs {
  StreamArgs s;
  cuda::MoeParams p;
  int nproj;        // 2: gate/up; 1: down
  float* out;       // [matrices][8][s.w.n] the finished outputs of the projection
  int* finish_ctr;  // gate/up: [max_slots][inter/128] (gate and up of a group); down: [hidden/128]
  // gate/up: the down projection's staged input (its x fragments per slot, int8 statistics)
  void* next_x;
  float2* next_qstats;
  bool next_int8;
  size_t next_x_bytes;
};

// The plain kernel's stand-in for MoeStreamArgs.
struct NoMoe {};

template <class Moe>
__device__ __forceinline__ int moe_slot(const Moe& mo, int mat) {
  return mo.nproj == 2 ? mat >> 1 : mat;
}

template <class Moe>
__device__ __forceinline__ const cuda::Exl3Matrix& moe_matrix(const Moe& mo, const SlotTable& st, int mat) {
  const int e = st.expert[moe_slot(mo, mat)];
  if (mo.nproj == 1) return mo.p.down[e];
  return (mat & 1) ? mo.p.up[e] : mo.p.gate[e];
}

// A MoE column group's end (red: its m rows of sums before the output transform). Gate/up: the
// outputs (+ bias, bf16 points) go to mo.out; the second of a group's gate and up applies the
// clamped SwiGLU, the routing weight and the down projection's suh and input Hadamard, and stages
// the result as the down projection's x (chunk ng of its k). Down: each expert's output (+ bias
// where the token routed to it) goes to mo.out; the last of the group's experts sums them in slot
// order (the grouped kernels' order) and writes y.
template <class Moe>
__device__ void moe_finish(const Moe& mo, const SlotTable& st, const float* red, int mat, int ng) {
  const cuda::MoeParams& p = mo.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = mo.s.w.n, slot = moe_slot(mo, mat);
  const cuda::Exl3Matrix& w = moe_matrix(mo, st, mat);
  float* out = mo.out + static_cast<size_t>(mat) * 8 * n;
  for (int r = warp; r < p.m; r += kWarps) {
    float v[4];
    out_transform(red + r * 128, w.svh, ng * 128, v);
    const bool add_bias = w.bias && (mo.nproj == 2 || st.weight[slot][r] != 0.0f);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = ng * 128 + 4 * lane + e;
      float o = v[e];
      if (add_bias) o += __half2float(__ushort_as_half(w.bias[c]));
      if (p.bf16_points) o = __bfloat162float(__float2bfloat16_rn(o));
      out[static_cast<size_t>(r) * n + c] = o;
    }
  }
  const int ngroups = n / 128;
  if (mo.nproj == 2) {
    if (!last_arrival(mo.finish_ctr + slot * ngroups + ng, 2)) return;
    const cuda::Exl3Matrix& wd = p.down[st.expert[slot]];
    const float* g = mo.out + static_cast<size_t>(2 * slot) * 8 * n;
    const float* u = g + static_cast<size_t>(8) * n;
    unsigned char* xd = static_cast<unsigned char*>(mo.next_x) + slot * mo.next_x_bytes;
    for (int r = warp; r < (mo.next_int8 ? 4 : 8); r += kWarps) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (r < p.m) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int c = ng * 128 + 4 * lane + q;
          v[q] = swiglu_input(__ldcg(g + static_cast<size_t>(r) * n + c), __ldcg(u + static_cast<size_t>(r) * n + c),
                              st.weight[slot][r], p.swiglu_limit, p.bf16_points,
                              __half2float(__ushort_as_half(wd.suh[c])));
        }
        hadamard128(v);
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] *= kHadScale;
      }
      if (mo.next_int8) {
        stage_int8_warp(v, r, ng, reinterpret_cast<uint32_t*>(xd),
                        mo.next_qstats + static_cast<size_t>(slot) * ngroups * 4);
      } else {
        stage_f16_warp(v, r, ng, reinterpret_cast<__half*>(xd));
      }
    }
    return;
  }
  if (!last_arrival(mo.finish_ctr + ng, st.n)) return;
  for (int r = warp; r < p.m; r += kWarps) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int sl = 0; sl < st.n; ++sl) {
      const float* src = mo.out + (static_cast<size_t>(sl) * 8 + r) * n + ng * 128 + 4 * lane;
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] += __ldcg(src + q);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int c = ng * 128 + 4 * lane + q;
      const float o = p.bf16_points ? __bfloat162float(__float2bfloat16_rn(acc[q])) : acc[q];
      if (c < p.y_cols) store_act(p.y, static_cast<int>(p.y_type), static_cast<int64_t>(r) * p.y_stride + c, o);
    }
  }
}

// The stream kernels' body; Moe = NoMoe for the plain kernel, MoeStreamArgs (with the block's slot
// table st) for the MoE's.
template <int K, int CB, bool INT8, class Moe>
__device__ __forceinline__ void stream_body(const StreamArgs& a, const Moe& mo, const SlotTable* st,
                                            unsigned char* smem) {
  constexpr bool MOE = !std::is_same_v<Moe, NoMoe>;
  __shared__ int s_last;
  constexpr int TW = Tile<K>::kWords;
  constexpr int NG = ring_groups(K);
  constexpr int CH = 2 * K * kGroup;  // 16-byte trellis chunks per group and warp
  constexpr int TOKB = INT8 ? 4 : 8;
  constexpr int FB = stream_frag_bytes(INT8);
  constexpr int XCH = 32 * FB / 16;   // 16-byte x chunks per k-tile (one k-tile per warp)
  using Frag = std::conditional_t<INT8, uint4, uint2>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int U = a.units_per_group;
  const int ngroups = a.w.n / 128;
  int batch = a.batch;
  if constexpr (MOE) batch = st->n * mo.nproj;
  const bool multi = MOE || a.batch > 1;
  const int total = batch * ngroups * U;  // units; u / U is the column group over all matrices
  // A MoE grid is sized for its most matrices: blocks past the units of this routing leave (every
  // block of the rest then owns at least one unit, which the group tickets count on).
  const int G = MOE ? min(static_cast<int>(gridDim.x), total) : static_cast<int>(gridDim.x), b = blockIdx.x;
  if (MOE && b >= G) return;
  const int u0 = unit_begin(b, total, G), u1 = unit_begin(b + 1, total, G);
  const int nq = u1 - u0;
  const int ntn = a.w.n / 16;
  const size_t row_stride = static_cast<size_t>(ntn) * 16 * K;  // uint16 between k-tiles
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem) + warp * NG * kGroup * TW;
  unsigned char* xring = smem + ring_bytes(K);  // [NG][kGroup k-tiles][32 lanes] Frag
  float* red = reinterpret_cast<float*>(xring + NG * kGroup * 32 * FB);

  // Unit u: column group gg = u / U (matrix gg / ngroups, its group gg % ngroups), k-tiles
  // 8 * (u % U) .. + 8; this warp's column tile of the group. The trellis and x prefetches and the
  // compute loop each step their own UnitPos through the block's units.
  UnitPos tpos, xpos, cpos;
  tpos.init(u0, U, ngroups);
  xpos = cpos = tpos;
  // The prefetches' source addresses (this warp's column tile at the unit's first k-tile; this
  // lane's piece of the unit's x) step by a constant stride inside a column group and are worked
  // out afresh only where a group or a matrix begins: recomputing them per unit cost about as many
  // instructions as a tile's decode.
  int tmat = -1;
  const uint16_t* tbase = a.w.trellis;
  const uint16_t* tsrc = nullptr;
  auto seek_trellis = [&]() {
    if (multi && tpos.mat != tmat) {  // the matrix's trellis, looked up once per matrix
      tmat = tpos.mat;
      if constexpr (MOE) {
        const cuda::Exl3Matrix& w = moe_matrix(mo, *st, tmat);
        if (w.bits != K || w.codebook != a.w.codebook || w.k != a.w.k || w.n != a.w.n) __trap();  // not this kind
        tbase = w.trellis;
      } else {
        tbase = a.ws[tmat].trellis;
      }
    }
    tsrc = tbase + (static_cast<size_t>(tpos.kc) * kGroup * ntn + tpos.ng * 8 + warp) * 16 * K;
  };
  const unsigned char* xsrc = nullptr;
  auto seek_x = [&]() {
    xsrc = static_cast<const unsigned char*>(a.xfrag) + xpos.mat * a.xfrag_batch_bytes +
           static_cast<size_t>(xpos.kc * kGroup + warp) * 32 * FB + lane * 16;
  };
  if (nq > 0) seek_trellis();
  seek_x();
  // Shared-space addresses of the rings, converted once (not at every copy).
  const unsigned ring_s = cp::shared_address(ring), xring_s = cp::shared_address(xring);
  auto prefetch_trellis = [&](int q) {
    if (q < nq) {
      const unsigned dst = ring_s + (q % NG) * kGroup * TW * 4;
#pragma unroll
      for (int c = lane; c < CH; c += 32) {
        const int j = c / (2 * K), part = c % (2 * K);
        cp::cp_detail::copy16<kCpOrder, cp::CpL2::None>(dst + (j * TW + part * 4) * 4,
                                                        tsrc + j * row_stride + part * 8);
      }
      tpos.next(U, ngroups);
      if (tpos.kc != 0) {
        tsrc += kGroup * row_stride;
      } else if (q + 1 < nq) {
        seek_trellis();  // a new column group (and maybe matrix); past the block's units there is none
      }
    }
  };
  // The unit's x fragments, shared by the block: warp w copies k-tile w.
  auto prefetch_x = [&](int q) {
    if (q < nq) {
      if (lane < XCH)
        cp::cp_detail::copy16<kCpOrder, cp::CpL2::None>(xring_s + ((q % NG) * kGroup + warp) * 32 * FB + lane * 16,
                                                        xsrc);
      xpos.next(U, ngroups);
      if (xpos.kc != 0) {
        xsrc += kGroup * 32 * FB;
      } else {
        seek_x();
      }
    }
  };
  // The trellis never depends on earlier kernels: start streaming it before waiting for the
  // staging kernel; the first commit group then holds all of it plus unit 0's x.
#pragma unroll
  for (int g = 0; g < NG - 1; ++g) prefetch_trellis(g);
  griddep_wait();
  griddep_launch_dependents();
#pragma unroll
  for (int g = 0; g < NG - 1; ++g) {
    prefetch_x(g);
    cp::cp_async_commit<kCpOrder>();
  }

  int idx[3], off;
  lane_window<K>(lane, idx, off);
  const int g8 = lane >> 2, tig = lane & 3, col = 16 * warp + g8;
  using Acc = std::conditional_t<INT8, int, float>;
  Acc acc[4] = {0, 0, 0, 0};
  float f0 = 0.0f, f1 = 0.0f;  // int8: flushed per unit (token tig, columns col and col + 8)

  for (int q = 0; q < nq; ++q, cpos.next(U, ngroups)) {
    cp::cp_async_wait<NG - 2, kCpOrder>();
    __syncthreads();  // unit q's x (copied by all warps) is visible; every warp is done with unit q - 1
    prefetch_trellis(q + NG - 1);
    prefetch_x(q + NG - 1);
    cp::cp_async_commit<kCpOrder>();
    const uint32_t* grp = ring + (q % NG) * kGroup * TW;
    const Frag* xf = reinterpret_cast<const Frag*>(xring) + (q % NG) * kGroup * 32 + lane;
    float2 qs;  // int8: the scale of this unit's chunk, loaded ahead of the tiles that hide its latency
    if constexpr (INT8) qs = a.qstats[(cpos.mat * U + cpos.kc) * 4 + tig];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      uint32_t st[8];
      tile_states<K>(grp + j * TW, idx, off, st);
      const Frag x = xf[j * 32];
      if constexpr (INT8) {
#pragma unroll
        for (int i = 0; i < 8; ++i) st[i] *= kMul1Mult;
        mma_u8s8_nv(acc, st[0], st[4], st[2], st[6], x.x, x.y);
        mma_u8s8_nv(acc, st[1], st[5], st[3], st[7], x.z, x.w);
      } else {
        mma_f16_nv(acc, decode_pair<CB>(st[0], st[1]), decode_pair<CB>(st[4], st[5]), decode_pair<CB>(st[2], st[3]),
                   decode_pair<CB>(st[6], st[7]), x.x, x.y);
      }
    }
    if constexpr (INT8) {
      f0 += qs.x * (static_cast<float>(acc[0]) + static_cast<float>(acc[1]) * (1.0f / 254.0f)) + qs.y;
      f1 += qs.x * (static_cast<float>(acc[2]) + static_cast<float>(acc[3]) * (1.0f / 254.0f)) + qs.y;
      acc[0] = acc[1] = acc[2] = acc[3] = 0;
    }
    if (q + 1 < nq && cpos.kc + 1 != U) continue;

    // ---- end of this block's part of column group gg: every warp gets here together ----
    const int mat = cpos.mat, ng = cpos.ng, gg = mat * ngroups + ng;
    if constexpr (INT8) {
      red[tig * 128 + col] = f0;
      red[tig * 128 + col + 8] = f1;
      f0 = f1 = 0.0f;
    } else {
      red[(2 * tig) * 128 + col] = acc[0];
      red[(2 * tig + 1) * 128 + col] = acc[1];
      red[(2 * tig) * 128 + col + 8] = acc[2];
      red[(2 * tig + 1) * 128 + col + 8] = acc[3];
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    }
    __syncthreads();
    const int gu0 = gg * U, gu1 = gu0 + U;
    bool finish = true;
    if (u0 > gu0 || u1 < gu1) {
      // Shared column group: slot 0 holds the group a block starts in, slot 1 the one it ends in.
      const int slot = gg == u0 / U ? 0 : 1;
      float* mine = a.part + (static_cast<size_t>(b) * 2 + slot) * TOKB * 128;
      for (int i = tid; i < a.m * 128; i += kThreads) mine[i] = red[i];
      __threadfence();
      __syncthreads();
      const int bf = block_of_unit(gu0, total, G), bl = block_of_unit(gu1 - 1, total, G);
      if (tid == 0) s_last = atomicAdd(a.counters + gg, 1) == bl - bf;
      __syncthreads();
      finish = s_last;
      if (finish) {
        __threadfence();
        // Block bf may hold the group as its last one (slot 1); the later blocks all start in
        // it (slot 0), at a fixed stride: their partials load 8 at a time.
        const int sl0 = gg == unit_begin(bf, total, G) / U ? 0 : 1;
        for (int i = tid; i < a.m * 128; i += kThreads) {
          const float first = __ldcg(a.part + (static_cast<size_t>(bf) * 2 + sl0) * TOKB * 128 + i);
          const float* rest = a.part + (static_cast<size_t>(bf + 1) * 2) * TOKB * 128 + i;
          red[i] = first + sum_splits(rest, 2 * TOKB * 128, bl - bf);
        }
        if (tid == 0) a.counters[gg] = 0;  // every block of the group has arrived: ready for the next call
        __syncthreads();
      }
    }
    if constexpr (MOE) {
      if (finish) moe_finish(mo, *st, red, mat, ng);
    } else if (finish) {
      const uint16_t* svh = a.batch > 1 ? a.ws[mat].svh : a.w.svh;
      const uint16_t* bias = a.batch > 1 ? a.ws[mat].bias : a.w.bias;
      const int64_t y0 = mat * a.y_batch_stride;
      for (int r = warp; r < a.m; r += kWarps) {
        float v[4];
        out_transform(red + r * 128, svh, ng * 128, v);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = ng * 128 + 4 * lane + e;
          float o = v[e];
          if (bias) o += __half2float(__ushort_as_half(bias[c]));
          if (a.round_bf16) o = __bfloat162float(__float2bfloat16_rn(o));
          if (c < a.y_cols) store_act(a.y, a.y_type, y0 + static_cast<int64_t>(r) * a.y_stride + c, o);
        }
      }
    }
    __syncthreads();  // red is rewritten at the next column group
  }
  cp::cp_async_wait<0, kCpOrder>();
}

template <int K, int CB, bool INT8>
__global__ void __launch_bounds__(kThreads, 4) stream_kernel(const StreamArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  stream_body<K, CB, INT8>(a, NoMoe{}, nullptr, smem);
}

template <int K, int CB, bool INT8>
__global__ void __launch_bounds__(kThreads, 4) moe_stream_kernel(const MoeStreamArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ SlotTable st;
  build_slots(a.p, st);  // the routing is complete before the staging kernel ahead of this one ran
  stream_body<K, CB, INT8>(a.s, a, &st, smem);
}

}  // namespace dsv41::exl3::dev
