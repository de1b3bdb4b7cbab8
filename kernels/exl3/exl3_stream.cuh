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
// Both kernels take part in programmatic dependent launch: the stream kernel prefetches its first
// trellis groups before waiting for the staging kernel, so its launch and pipeline fill overlap
// the staging. On a plain launch griddepcontrol is a no-op.
#pragma once
#include "exl3/exl3_block.cuh"

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

template <int K, int CB, bool INT8>
__global__ void __launch_bounds__(kThreads, 4) stream_kernel(const StreamArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
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
  const int total = a.batch * ngroups * U;  // units; u / U is the column group over all matrices
  const int G = gridDim.x, b = blockIdx.x;
  const int u0 = unit_begin(b, total, G), u1 = unit_begin(b + 1, total, G);
  const int nq = u1 - u0;
  const int ntn = a.w.n / 16;
  const size_t row_stride = static_cast<size_t>(ntn) * 16 * K;  // uint16 between k-tiles
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem) + warp * NG * kGroup * TW;
  unsigned char* xring = smem + ring_bytes(K);  // [NG][kGroup k-tiles][32 lanes] Frag
  float* red = reinterpret_cast<float*>(xring + NG * kGroup * 32 * FB);

  // Unit u: column group gg = u / U (matrix gg / ngroups, its group gg % ngroups), k-tiles
  // 8 * (u % U) .. + 8; this warp's column tile of the group.
  auto trellis_of = [&](int mat) { return a.batch > 1 ? a.ws[mat].trellis : a.w.trellis; };
  auto prefetch_trellis = [&](int q) {
    if (q < nq) {
      const int u = u0 + q, gg = u / U, mat = a.batch > 1 ? gg / ngroups : 0;
      const uint16_t* src =
          trellis_of(mat) + (static_cast<size_t>(u % U) * kGroup * ntn + (gg - mat * ngroups) * 8 + warp) * 16 * K;
      uint32_t* dst = ring + (q % NG) * kGroup * TW;
#pragma unroll
      for (int c = lane; c < CH; c += 32) {
        const int j = c / (2 * K), part = c % (2 * K);
        cp::cp_async16<kCpOrder>(dst + j * TW + part * 4, src + j * row_stride + part * 8);
      }
    }
  };
  // The unit's x fragments, shared by the block: warp w copies k-tile w.
  auto prefetch_x = [&](int q) {
    if (q < nq && lane < XCH) {
      const int u = u0 + q, kt = (u % U) * kGroup + warp, mat = a.batch > 1 ? u / U / ngroups : 0;
      cp::cp_async16<kCpOrder>(xring + ((q % NG) * kGroup + warp) * 32 * FB + lane * 16,
                               static_cast<const unsigned char*>(a.xfrag) + mat * a.xfrag_batch_bytes +
                                   static_cast<size_t>(kt) * 32 * FB + lane * 16);
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

  for (int q = 0; q < nq; ++q) {
    const int u = u0 + q;
    cp::cp_async_wait<NG - 2, kCpOrder>();
    __syncthreads();  // unit q's x (copied by all warps) is visible; every warp is done with unit q - 1
    prefetch_trellis(q + NG - 1);
    prefetch_x(q + NG - 1);
    cp::cp_async_commit<kCpOrder>();
    const uint32_t* grp = ring + (q % NG) * kGroup * TW;
    const Frag* xf = reinterpret_cast<const Frag*>(xring) + (q % NG) * kGroup * 32 + lane;
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
      const int qmat = a.batch > 1 ? u / U / ngroups : 0;
      const float2 qs = a.qstats[(qmat * U + u % U) * 4 + tig];  // the matrix's chunk u % U
      f0 += qs.x * (static_cast<float>(acc[0]) + static_cast<float>(acc[1]) * (1.0f / 254.0f)) + qs.y;
      f1 += qs.x * (static_cast<float>(acc[2]) + static_cast<float>(acc[3]) * (1.0f / 254.0f)) + qs.y;
      acc[0] = acc[1] = acc[2] = acc[3] = 0;
    }
    if (q + 1 < nq && (u + 1) % U != 0) continue;

    // ---- end of this block's part of column group gg: every warp gets here together ----
    const int gg = u / U, mat = a.batch > 1 ? gg / ngroups : 0, ng = gg - mat * ngroups;
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
    if (finish) {
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

}  // namespace dsv41::exl3::dev
