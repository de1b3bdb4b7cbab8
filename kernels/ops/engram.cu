// Engram (MODEL.md §5.3): staged table rows -> bf16( e4m3 · 2^(scale-127) ), and the per-stream
// gate with the reference's summation order. The gate stages the stream, key, gate weight and value
// rows of its (token, stream) in shared memory with the whole block; all warps form the partial
// sums of the three torch_sum chains' steps from there, and three warps run the fold cascades at
// once (one warp reading the chains from global memory waited a memory latency per step). Rows too
// wide for shared memory take the one-warp form.
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void engram_dequant_kernel(EngramDequantArgs a) {
  dev::pdl_enter();
  const int64_t total = a.n_out * a.head_dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / a.head_dim, d = idx % a.head_dim;
    const uint8_t* row = a.rows + static_cast<int64_t>(a.slots[r]) * a.row_bytes;
    a.out[idx] = dev::bf16_round(__fmul_rn(dev::e4m3_value(row[d]), dev::e8m0_value(row[a.head_dim + d / 32])));
  }
}

constexpr int kGateThreads = 256;

// Gate of (token t, stream j) = (blockIdx.x, blockIdx.y): the statistics and the gate as in
// engram_gate_kernel, then h += gate·value by the whole block.
__global__ void __launch_bounds__(kGateThreads) engram_gate_staged_kernel(EngramGateArgs a) {
  dev::pdl_enter();
  extern __shared__ float4 smem_f4[];
  __shared__ float stat[3];
  __shared__ float s_gate;
  const int64_t t = blockIdx.x, j = blockIdx.y, dim = a.dim, pitch = (dim + 3) / 4 * 4;
  float* sh = reinterpret_cast<float*>(smem_f4);
  float* sk = sh + pitch;
  float* sg = sk + pitch;
  float* sv = sg + pitch;
  float* scratch = sv + pitch;  // 3 x torch_sum_scratch_floats(dim)
  const int64_t scratch_n = dev::torch_sum_scratch_floats(dim);
  float* h = a.h + (t * a.hc + j) * dim;
  const float* kv = a.kv + t * (a.hc + 1) * dim;
  {
    float* const dst[4] = {sh, sk, sg, sv};
    const float* const src[4] = {h, kv + j * dim, a.gate_w + j * dim, kv + a.hc * dim};
    dev::block_stage<4>(dst, src, dim);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, nw = kGateThreads / 32;
  auto hgk = [&](int64_t i) { return __fmul_rn(__fmul_rn(sh[i], sg[i]), sk[i]); };
  auto hh = [&](int64_t i) { return __fmul_rn(sh[i], sh[i]); };
  auto kk = [&](int64_t i) { return __fmul_rn(sk[i], sk[i]); };
  dev::torch_sum_partials(hgk, dim, warp, nw, scratch);
  dev::torch_sum_partials(hh, dim, warp, nw, scratch + scratch_n);
  dev::torch_sum_partials(kk, dim, warp, nw, scratch + 2 * scratch_n);
  __syncthreads();
  if (warp == 0) {
    const float v = dev::torch_sum_cascade(hgk, dim, scratch);
    if ((threadIdx.x & 31) == 0) stat[0] = v;
  } else if (warp == 1) {
    const float v = dev::torch_sum_cascade(hh, dim, scratch + scratch_n);
    if ((threadIdx.x & 31) == 0) stat[1] = v;
  } else if (warp == 2) {
    const float v = dev::torch_sum_cascade(kk, dim, scratch + 2 * scratch_n);
    if ((threadIdx.x & 31) == 0) stat[2] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float dot = stat[0], ssh = stat[1], ssk = stat[2];
    const float fd = static_cast<float>(dim);
    const float rstd = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ssh, fd), a.eps))),
                                 __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ssk, fd), a.eps))));
    const float dd = __fmul_rn(__fmul_rn(dot, rstd), a.inv_sqrt_dim);
    const float mag = __fsqrt_rn(fmaxf(fabsf(dd), 1e-6f));
    s_gate = dev::sigmoid_ref(copysignf(mag, dd));
  }
  __syncthreads();
  const float gate = s_gate;
  for (int64_t i = threadIdx.x; i < dim; i += kGateThreads) h[i] = dev::bf16_round(__fadd_rn(sh[i], __fmul_rn(gate, sv[i])));
}

// One warp per (token, stream): dot of h·g_w·k in the reference's torch_sum order, per-stream
// rsqrt norms, signed-sqrt sigmoid gate, then h += gate·value (bf16).
__global__ void engram_gate_kernel(EngramGateArgs a) {
  dev::pdl_enter();
  const int64_t t = blockIdx.x, j = blockIdx.y;
  const int64_t dim = a.dim;
  float* h = a.h + (t * a.hc + j) * dim;
  const float* kv = a.kv + t * (a.hc + 1) * dim;
  const float* k = kv + j * dim;
  const float* value = kv + a.hc * dim;
  const float* gw = a.gate_w + j * dim;
  const float dot = dev::warp_torch_sum([&](int64_t i) { return __fmul_rn(__fmul_rn(h[i], gw[i]), k[i]); }, dim);
  const float sh = dev::warp_torch_sum([&](int64_t i) { return __fmul_rn(h[i], h[i]); }, dim);
  const float sk = dev::warp_torch_sum([&](int64_t i) { return __fmul_rn(k[i], k[i]); }, dim);
  const float fd = static_cast<float>(dim);
  const float rstd = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sh, fd), a.eps))),
                               __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sk, fd), a.eps))));
  const float dd = __fmul_rn(__fmul_rn(dot, rstd), a.inv_sqrt_dim);
  const float mag = __fsqrt_rn(fmaxf(fabsf(dd), 1e-6f));
  const float gate = dev::sigmoid_ref(copysignf(mag, dd));
  __syncwarp();
  for (int64_t i = threadIdx.x; i < dim; i += 32) h[i] = dev::bf16_round(__fadd_rn(h[i], __fmul_rn(gate, value[i])));
}

}  // namespace

namespace raw {
cudaError_t engram_dequant(const EngramDequantArgs& a, cudaStream_t s) {
  const int64_t total = a.n_out * a.head_dim;
  if (total == 0) return cudaSuccess;
  const int64_t b = (total + 255) / 256;
  launch_pdl(engram_dequant_kernel, static_cast<unsigned>(b < 65535 ? b : 65535), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t engram_gate(const EngramGateArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  const size_t smem =
      static_cast<size_t>(4 * ((a.dim + 3) / 4 * 4) + 3 * dev::torch_sum_scratch_floats(a.dim)) * sizeof(float);
  if (staged_smem_fits<engram_gate_staged_kernel>(smem)) {
    const cudaError_t e = allow_dynamic_smem<engram_gate_staged_kernel>(smem);
    if (e != cudaSuccess) return e;
    launch_pdl(engram_gate_staged_kernel, dim3(static_cast<unsigned>(a.n), static_cast<unsigned>(a.hc)), kGateThreads, smem, s, a);
    return cudaGetLastError();
  }
  launch_pdl(engram_gate_kernel, dim3(static_cast<unsigned>(a.n), static_cast<unsigned>(a.hc)), 32, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
