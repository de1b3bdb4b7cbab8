// x staging kernels of the grouped MoE layer: the gate/up input (x ⊙ suh, input Hadamard) once per
// (selected expert, projection, k-split) and the down input (act, already in the Hadamard basis)
// once per (expert, k-split), instead of once per output-column block. The format is the one
// small_block reads: int8 fragments + statistics for MUL1 matrices on the int8 path, else fp16 rows.
#include "exl3/exl3_launch.h"
#include "exl3/exl3_moe_kernel.cuh"

namespace dsv41::exl3::dev {
namespace {

// Stages k-tiles [kt0, kt1) of one matrix's input into `base` (the matrix's whole-k buffer).
__device__ void stage_one(const XSource& xs, bool int8, int k, int kt0, int kt1, unsigned char* base, int4* stats,
                          float* hbuf) {
  __shared__ uint32_t s_amax[4];
  __shared__ int s_hi[4], s_lo[4];
  if (int8) {
    stage_x<true>(xs, kt0, kt1, base + static_cast<size_t>(kt0) * 32 * 16, k, hbuf, s_amax, s_hi, s_lo);
    if (threadIdx.x < 4)
      stats[threadIdx.x] = make_int4(static_cast<int>(s_amax[threadIdx.x]), s_hi[threadIdx.x], s_lo[threadIdx.x], 0);
  } else {
    stage_x<false>(xs, kt0, kt1, base + static_cast<size_t>(kt0) * 16 * 2, k, hbuf, s_amax, s_hi, s_lo);
  }
}

}  // namespace

__global__ void __launch_bounds__(kThreads) moe_stage_gate_up_kernel(const MoeArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];  // [4][rows] fp32 (int8 scratch)
  __shared__ SlotTable st;
  griddep_wait();  // x and the routing come from earlier kernels
  griddep_launch_dependents();
  const cuda::MoeParams& p = a.p;
  int idx = blockIdx.x;
  const int split = idx % a.splits_gu;
  idx /= a.splits_gu;
  const int proj = idx % 2;
  const int slot = idx / 2;
  build_slots(p, st);
  if (slot >= st.n) return;
  const int e = st.expert[slot];
  const cuda::Exl3Matrix w = proj ? p.up[e] : p.gate[e];
  const int kt0 = split * a.kt_gu, kt1 = min(p.hidden / 16, kt0 + a.kt_gu);
  const XSource xs{p.x, static_cast<int>(p.x_type), 0, p.m, p.x_stride, p.x_cols, w.suh};
  const int mat = slot * 2 + proj;
  stage_one(xs, a.int8 && w.codebook == 2, p.hidden, kt0, kt1, a.x_gu + static_cast<size_t>(mat) * p.hidden * 32,
            a.stats_gu + (static_cast<size_t>(mat) * a.splits_gu + split) * 4, reinterpret_cast<float*>(smem));
}

__global__ void __launch_bounds__(kThreads) moe_stage_down_kernel(const MoeArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ SlotTable st;
  griddep_wait();  // act comes from the gate/up kernel
  griddep_launch_dependents();
  const cuda::MoeParams& p = a.p;
  const int split = blockIdx.x % a.splits_dn;
  const int slot = blockIdx.x / a.splits_dn;
  build_slots(p, st);
  if (slot >= st.n) return;
  const cuda::Exl3Matrix w = p.down[st.expert[slot]];
  const int kt0 = split * a.kt_dn, kt1 = min(p.inter / 16, kt0 + a.kt_dn);
  const size_t inter = p.inter;
  const XSource xs{a.act + static_cast<size_t>(slot) * 8 * inter, 2, 1, p.m, static_cast<int64_t>(inter),
                   static_cast<int64_t>(inter), nullptr};
  stage_one(xs, a.int8 && w.codebook == 2, p.inter, kt0, kt1, a.x_dn + static_cast<size_t>(slot) * inter * 32,
            a.stats_dn + (static_cast<size_t>(slot) * a.splits_dn + split) * 4, reinterpret_cast<float*>(smem));
}

cudaError_t launch_moe_stage_gate_up(const MoeArgs& a, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(a.max_slots * 2 * a.splits_gu);
  const size_t smem = stage_h_bytes(true, a.kt_gu * 16);
  return cuda::launch_pdl(moe_stage_gate_up_kernel, dim3(blocks), kThreads, smem, stream, a);
}

cudaError_t launch_moe_stage_down(const MoeArgs& a, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(a.max_slots * a.splits_dn);
  const size_t smem = stage_h_bytes(true, a.kt_dn * 16);
  return cuda::launch_pdl(moe_stage_down_kernel, dim3(blocks), kThreads, smem, stream, a);
}

}  // namespace dsv41::exl3::dev
