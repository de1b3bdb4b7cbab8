// Engram (MODEL.md §5.3): staged table rows -> bf16( e4m3 · 2^(scale-127) ), and the per-stream
// gate with the reference's summation order (one warp per (token, stream)).
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

__global__ void engram_dequant_kernel(EngramDequantArgs a) {
  const int64_t total = a.n_out * a.head_dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / a.head_dim, d = idx % a.head_dim;
    const uint8_t* row = a.rows + static_cast<int64_t>(a.slots[r]) * a.row_bytes;
    a.out[idx] = dev::bf16_round(__fmul_rn(dev::e4m3_value(row[d]), dev::e8m0_value(row[a.head_dim + d / 32])));
  }
}

// One warp per (token, stream): dot of h·g_w·k in the reference's torch_sum order, per-stream
// rsqrt norms, signed-sqrt sigmoid gate, then h += gate·value (bf16).
__global__ void engram_gate_kernel(EngramGateArgs a) {
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
  engram_dequant_kernel<<<static_cast<unsigned>(b < 65535 ? b : 65535), 256, 0, s>>>(a);
  return cudaGetLastError();
}
cudaError_t engram_gate(const EngramGateArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  engram_gate_kernel<<<dim3(static_cast<unsigned>(a.n), static_cast<unsigned>(a.hc)), 32, 0, s>>>(a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
