// RMSNorm (MODEL.md §4): bf16( w · (x · rsqrt(mean(x²) + eps)) ). The mean of squares is summed in
// the reference's order (warp_torch_sum), so the result is bit-identical.
//
// One block per row: the block stages the row and the weight in shared memory with 16-byte loads,
// the warps sum the reference's chains from there (block_torch_sum: the chains' steps in parallel,
// then the fold cascade), and the whole block writes the output. (A warp reading its chain straight from global memory waits a memory latency per step:
// 37 µs for a 5120-wide row.) Rows too wide for shared memory take the unstaged warp-per-row form.
//
// With codes/scales set, the kernel also writes ActQuant8 of its bf16-rounded output rows (the
// input of the FP8/FP4 linears that read the normed rows): in both forms a warp writes 32
// consecutive outputs of one row at a time, which is exactly one 32-block (d % 32 == 0). The same
// holds for the optional RoPE of the row's tail and QDQ8 (the attention's kv rows: one launch in
// place of three), whose pairs and blocks lie within a warp's 32 outputs.
#include "ops/act_quant.cuh"
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"
#include "ops/rope_qdq.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWideThreads = 512;  // staged form, rows wider than kWideRow
constexpr int64_t kWideRow = 1024;
constexpr int kWarps = 4;  // unstaged form: one warp per row

// The optional RoPE of the row's tail and QDQ8 of the normed value v at column i of row `row`
// (RmsNormArgs::rope, qdq8). The whole warp calls it with 32 consecutive columns (d % 32 == 0).
__device__ __forceinline__ float finish(const RmsNormArgs& a, float v, int64_t row, int64_t i) {
  if (a.rope.freqs) v = dev::rope_tail_lane(a.rope, v, row, i, a.d);
  if (a.qdq8) v = dev::qdq_lane(QdqKind::Q8, v);
  return v;
}

// kT threads per row: wide rows take more, so that each warp quantises fewer 32-blocks one after
// another (the output loop's per-block chain of shuffles and roundings is latency-bound).
template <int kT>
__global__ void __launch_bounds__(kT) rms_norm_staged_kernel(RmsNormArgs a) {
  dev::pdl_enter();
  extern __shared__ float4 smem_f4[];
  float* sx = reinterpret_cast<float*>(smem_f4);
  float* sw = sx + (a.d + 3) / 4 * 4;
  float* scratch = sw + (a.d + 3) / 4 * 4;
  __shared__ float s_sum;
  const int64_t row = blockIdx.x;
  const float* x = a.x + row * a.x_stride;
  float* out = a.out + row * a.out_stride;
  {
    float* const dst[2] = {sx, sw};
    const float* const src[2] = {x, a.w};
    dev::block_stage<2>(dst, src, a.d);
  }
  __syncthreads();  // out may alias x: every read of x is done before the first write below
  const float sum = dev::block_torch_sum([&](int64_t i) { return __fmul_rn(sx[i], sx[i]); }, a.d, scratch, &s_sum);
  const float var = __fdiv_rn(sum, static_cast<float>(a.d));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));
  for (int64_t i = threadIdx.x; i < a.d; i += kT) {
    const float v = finish(a, dev::bf16_round(__fmul_rn(sw[i], __fmul_rn(sx[i], r))), row, i);
    out[i] = v;
    if (a.codes) dev::act_quant8_store(v, row, i, a.d, a.codes, a.scales);
    if (a.bf16_out) a.bf16_out[row * a.bf16_stride + i] = dev::f32_to_bf16_bits(v);
  }
}

__global__ void rms_norm_kernel(RmsNormArgs a) {
  dev::pdl_enter();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= a.rows) return;
  const float* x = a.x + row * a.x_stride;
  float* out = a.out + row * a.out_stride;
  const float sum = dev::warp_torch_sum([&](int64_t i) { return __fmul_rn(x[i], x[i]); }, a.d);
  const float var = __fdiv_rn(sum, static_cast<float>(a.d));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));
  __syncwarp();
  for (int64_t i = threadIdx.x & 31; i < a.d; i += 32) {
    const float v = finish(a, dev::bf16_round(__fmul_rn(a.w[i], __fmul_rn(x[i], r))), row, i);
    out[i] = v;
    if (a.codes) dev::act_quant8_store(v, row, i, a.d, a.codes, a.scales);
    if (a.bf16_out) a.bf16_out[row * a.bf16_stride + i] = dev::f32_to_bf16_bits(v);
  }
}

}  // namespace

namespace raw {
cudaError_t rms_norm(const RmsNormArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(2 * ((a.d + 3) / 4 * 4) + dev::torch_sum_scratch_floats(a.d)) * sizeof(float);
  if (smem <= kMaxStagedSmem && a.rows <= 0x7fffffff) {
    // 256 threads up to rows of 1024 (four 32-blocks per warp at most), 512 above: the model's
    // hidden rows of 5120 then quantise 10 blocks per warp instead of 20 (H200, one row with codes:
    // 9.9 -> 6.9 us). (1024 threads would cap the kernel at 64 registers: it spills.)
    const int threads = a.d > kWideRow ? kWideThreads : kThreads;
    cudaError_t e = threads == kWideThreads ? allow_dynamic_smem<rms_norm_staged_kernel<kWideThreads>>(smem)
                                            : allow_dynamic_smem<rms_norm_staged_kernel<kThreads>>(smem);
    if (e != cudaSuccess) return e;
    const unsigned grid = static_cast<unsigned>(a.rows);
    if (threads == kWideThreads) launch_pdl(rms_norm_staged_kernel<kWideThreads>, grid, kWideThreads, smem, s, a);
    else launch_pdl(rms_norm_staged_kernel<kThreads>, grid, kThreads, smem, s, a);
    return cudaGetLastError();
  }
  const unsigned blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  launch_pdl(rms_norm_kernel, blocks, kWarps * 32, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
