// Launcher of the MoE down kernel (own compile unit: it instantiates every K x codebook).
#include "exl3/exl3_launch.h"
#include "exl3/exl3_moe_kernel.cuh"

namespace dsv41::exl3::dev {

__global__ void __launch_bounds__(kThreads) moe_down_kernel(const MoeArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ SlotTable st;
  const cuda::MoeParams& p = a.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ngroups = p.hidden / 128;
  int idx = blockIdx.x;
  const int split = idx % a.splits_dn;
  idx /= a.splits_dn;
  const int ng = idx % ngroups;
  const int slot = idx / ngroups;
  build_slots(p, st);
  if (slot >= st.n) return;
  const int e = st.expert[slot];
  const cuda::Exl3Matrix w = p.down[e];
  if (w.bits > p.max_bits) __trap();  // shared memory was sized for max_bits
  const int kt0 = split * a.kt_dn, kt1 = min(p.inter / 16, kt0 + a.kt_dn);
  const size_t inter = p.inter, hidden = p.hidden;
  float* red = small_block_any(w, ng, kt0, kt1, smem, a.int8, a.x_dn + static_cast<size_t>(slot) * inter * 32,
                               a.stats_dn + (static_cast<size_t>(slot) * a.splits_dn + split) * 4);

  float* part = a.part_dn + (static_cast<size_t>(slot) * a.splits_dn + split) * 8 * hidden;
  for (int i = tid; i < p.m * 128; i += kThreads) part[(i >> 7) * hidden + ng * 128 + (i & 127)] = red[i];
  if (!last_arrival(a.ctr_dn + ng, st.n * a.splits_dn)) return;

  for (int r = warp; r < p.m; r += kWarps) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < st.n; ++s) {
      const cuda::Exl3Matrix ws = p.down[st.expert[s]];
      const float* src = a.part_dn + static_cast<size_t>(s) * a.splits_dn * 8 * hidden + r * hidden + ng * 128 + 4 * lane;
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = sum_splits(src + q, 8 * hidden, a.splits_dn);
      hadamard128(v);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int col = ng * 128 + 4 * lane + q;
        float o = v[q] * kHadScale * __half2float(__ushort_as_half(ws.svh[col]));
        // A token that did not route to this expert contributes exactly nothing (its act row is 0).
        if (ws.bias && st.weight[s][r] != 0.0f) o += __half2float(__ushort_as_half(ws.bias[col]));
        if (p.bf16_points) o = __bfloat162float(__float2bfloat16_rn(o));
        acc[q] += o;
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = ng * 128 + 4 * lane + q;
      const float out = p.bf16_points ? __bfloat162float(__float2bfloat16_rn(acc[q])) : acc[q];
      if (col < p.y_cols) store_act(p.y, static_cast<int>(p.y_type), static_cast<int64_t>(r) * p.y_stride + col, out);
    }
  }
}

cudaError_t launch_moe_down(const MoeArgs& a, size_t smem, cudaStream_t stream) {
  const cudaError_t e = cuda::raise_smem_once(moe_down_kernel, cuda::moe_smem_bytes(8, cuda::kMaxSmallRows));
  if (e != cudaSuccess) return e;
  const unsigned blocks = static_cast<unsigned>(a.max_slots * (a.p.hidden / 128) * a.splits_dn);
  return cuda::launch_pdl(moe_down_kernel, dim3(blocks), kThreads, smem, stream, a);
}

}  // namespace dsv41::exl3::dev
