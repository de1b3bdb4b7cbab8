// Device code of the grouped EXL3 linear (see exl3_grouped.h): one block per (tile, 128-column
// group), the large-m block of the tile's row class over the whole k range, then the output
// transform per row.
#pragma once
#include "exl3/exl3_block.cuh"
#include "exl3/exl3_grouped.h"

namespace dsv41::exl3::dev {

// Blocks an SM holds: 3 (24 warps) caps registers at 80, which the 64-row class meets with 4-12
// bytes of spill at K = 3, 6 and 8 (ptxas, sm_90a); the decode is issue-bound, and more warps keep
// the schedulers busier.
constexpr int kGroupedMinBlocks = 3;

// Tiles of up to 16H rows (the launch's row class).
template <int K, int CB, int H>
__global__ void __launch_bounds__(kThreads, kGroupedMinBlocks) grouped_kernel(const cuda::GroupedGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  // Column groups vary fastest: the blocks of one tile run together and share its x rows in L2,
  // and each reads its own column group's trellis.
  const int ng = blockIdx.x;
  const cuda::GroupedTile t = p.tiles[blockIdx.y];
  // Selects, not indexes, the parameter arrays (a dynamic index would copy them to local memory).
  const bool second = t.set != 0;
  const cuda::Exl3Matrix w = (second ? p.mats[1] : p.mats[0])[t.matrix];
  // The launch was planned for this class and shape; anything else is a caller bug.
  if (w.bits != K || w.codebook != CB || w.k != p.k || w.n != p.n || t.rows < 1 || t.rows > 16 * H) __trap();
  float* red = reinterpret_cast<float*>(smem + ring_bytes(K));
  large_block<K, CB, H>(w, second ? p.xh[1] : p.xh[0], t.row0 + t.rows, t.row0, ng, 0, p.k / 16, H, smem, red);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* y = second ? p.y[1] : p.y[0];
  for (int r = warp; r < t.rows; r += kWarps) {
    float v[4];
    out_transform(red + r * 128, w.svh, ng * 128, v);
    const int row = p.out_row ? p.out_row[t.row0 + r] : t.row0 + r;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = ng * 128 + 4 * lane + e;
      float o = v[e];
      if (w.bias) o += __half2float(__ushort_as_half(w.bias[col]));
      if (p.round_bf16) o = __bfloat162float(__float2bfloat16_rn(o));
      if (col < p.y_cols) y[static_cast<int64_t>(row) * p.y_stride + col] = o;
    }
  }
}

}  // namespace dsv41::exl3::dev
