// Launcher of the MoE gate/up kernel (own compile unit: it instantiates every K x codebook).
#include "exl3/exl3_launch.h"
#include "exl3/exl3_moe_kernel.cuh"

namespace dsv41::exl3::dev {

__global__ void __launch_bounds__(kThreads) moe_gate_up_kernel(const MoeArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ SlotTable st;
  __shared__ float s_sum[2][8 * 128];
  const cuda::MoeParams& p = a.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ngroups = p.inter / 128;
  int idx = blockIdx.x;
  const int split = idx % a.splits_gu;
  idx /= a.splits_gu;
  const int proj = idx % 2;
  idx /= 2;
  const int ng = idx % ngroups;
  const int slot = idx / ngroups;
  build_slots(p, st);
  if (slot >= st.n) return;
  const int e = st.expert[slot];
  const cuda::Exl3Matrix w = proj ? p.up[e] : p.gate[e];
  if (w.bits > p.max_bits) __trap();  // shared memory was sized for max_bits
  const int kt0 = split * a.kt_gu, kt1 = min(p.hidden / 16, kt0 + a.kt_gu);
  const int mat = slot * 2 + proj;
  float* red = small_block_any(w, ng, kt0, kt1, smem, a.int8, a.x_gu + static_cast<size_t>(mat) * p.hidden * 32,
                               a.stats_gu + (static_cast<size_t>(mat) * a.splits_gu + split) * 4);

  const size_t inter = p.inter;
  float* part = a.part_gu + ((static_cast<size_t>(slot) * 2 + proj) * a.splits_gu + split) * 8 * inter;
  for (int i = tid; i < p.m * 128; i += kThreads) part[(i >> 7) * inter + ng * 128 + (i & 127)] = red[i];
  if (!last_arrival(a.ctr_gu + slot * ngroups + ng, 2 * a.splits_gu)) return;

  for (int i = tid; i < 2 * p.m * 128; i += kThreads) {
    const int pr = i / (p.m * 128), r = (i >> 7) % p.m, c = i & 127;
    s_sum[pr][r * 128 + c] = sum_splits(a.part_gu + (static_cast<size_t>(slot) * 2 + pr) * a.splits_gu * 8 * inter +
                                            r * inter + ng * 128 + c, 8 * inter, a.splits_gu);
  }
  __syncthreads();
  const cuda::Exl3Matrix wg = p.gate[e], wu = p.up[e], wd = p.down[e];
  const float lim = p.swiglu_limit;
  for (int r = warp; r < p.m; r += kWarps) {
    float g[4], u[4];
    out_transform(&s_sum[0][r * 128], wg.svh, ng * 128, g);
    out_transform(&s_sum[1][r * 128], wu.svh, ng * 128, u);
    const float wt = st.weight[slot][r];
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = ng * 128 + 4 * lane + q;
      float gv = g[q], uv = u[q];
      if (wg.bias) gv += __half2float(__ushort_as_half(wg.bias[col]));
      if (wu.bias) uv += __half2float(__ushort_as_half(wu.bias[col]));
      if (p.bf16_points) {
        gv = __bfloat162float(__float2bfloat16_rn(gv));
        uv = __bfloat162float(__float2bfloat16_rn(uv));
      }
      v[q] = swiglu_input(gv, uv, wt, lim, p.bf16_points, __half2float(__ushort_as_half(wd.suh[col])));
    }
    hadamard128(v);
    float* dst = a.act + (static_cast<size_t>(slot) * 8 + r) * inter + ng * 128 + 4 * lane;
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = v[q] * kHadScale;
  }
}

cudaError_t launch_moe_gate_up(const MoeArgs& a, size_t smem, cudaStream_t stream) {
  const cudaError_t e = cuda::raise_smem_once(moe_gate_up_kernel, cuda::moe_smem_bytes(8, cuda::kMaxSmallRows));
  if (e != cudaSuccess) return e;
  const unsigned blocks = static_cast<unsigned>(a.max_slots * (a.p.inter / 128) * 2 * a.splits_gu);
  return cuda::launch_pdl(moe_gate_up_kernel, dim3(blocks), kThreads, smem, stream, a);
}

}  // namespace dsv41::exl3::dev
