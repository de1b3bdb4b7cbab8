// MoE pieces (MODEL.md §5.5): the router (fp32 gate GEMV, sqrtsoftplus or sigmoid scores, biased
// top-k for selection, unbiased weights renormalised and scaled), the clamped SwiGLU with the
// routing weight, and the combine (routed outputs added in increasing expert id, then the shared
// expert, one bf16 rounding).
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kRouterWarps = 8;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopk = 32;

// Scores of every (token, expert): one warp per expert, many blocks per token.
__global__ void router_scores_kernel(RouterArgs a) {
  const int64_t t = blockIdx.y;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kRouterWarps + threadIdx.x / 32;
  if (e >= a.n_experts) return;
  const float* x = a.x + t * a.dim;
  const float* w = a.gate_w + e * a.dim;
  float z = dev::warp_gemm_dot([&](int64_t k) { return w[k]; }, [&](int64_t k) { return x[k]; }, a.dim);
  if ((threadIdx.x & 31) != 0) return;
  z = __fdiv_rn(z, a.temp);
  float s;
  if (a.scoring == Scoring::Sigmoid) {
    s = dev::sigmoid_ref(z);
  } else {
    const float sp = z > 20.0f ? z : dev::log1p_ref(dev::exp_ref(z));
    s = __fsqrt_rn(sp);
  }
  a.scratch[t * 2 * a.n_experts + e] = s;
  a.scratch[t * 2 * a.n_experts + a.n_experts + e] = __fadd_rn(s, a.gate_bias[e]);
}

// Selection of one token: one warp, top-k by repeated warp argmax (larger value first, NaN above
// everything, lower id on ties), then the unbiased weights in selection order.
__global__ void router_select_kernel(RouterArgs a) {
  __shared__ unsigned char taken[kMaxExperts];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const float* score = a.scratch + t * 2 * a.n_experts;
  const float* biased = score + a.n_experts;
  for (int64_t e = lane; e < a.n_experts; e += 32) taken[e] = 0;
  __syncwarp();
  int sel[kMaxTopk];
  for (int64_t i = 0; i < a.top_k; ++i) {
    float best = 0.0f;
    int best_e = -1;
    for (int64_t e = lane; e < a.n_experts; e += 32) {
      if (taken[e]) continue;
      const float v = biased[e];
      const bool better = best_e < 0 || (isnan(v) && !isnan(best)) || (!isnan(best) && v > best);
      if (better) best = v, best_e = static_cast<int>(e);
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(dev::kFull, best, o);
      const int oe = __shfl_xor_sync(dev::kFull, best_e, o);
      bool take = false;
      if (oe >= 0) {
        if (best_e < 0) take = true;
        else if (isnan(ov) != isnan(best)) take = isnan(ov);
        else if (!isnan(ov) && ov != best) take = ov > best;
        else take = oe < best_e;
      }
      if (take) best = ov, best_e = oe;
    }
    sel[i] = best_e;
    if (lane == 0 && best_e >= 0) taken[best_e] = 1;
    __syncwarp();
  }
  if (lane != 0) return;
  float sum = 0.0f;
  for (int64_t i = 0; i < a.top_k; ++i) sum = __fadd_rn(sum, sel[i] >= 0 ? score[sel[i]] : 0.0f);
  for (int64_t i = 0; i < a.top_k; ++i) {
    float w = sel[i] >= 0 ? score[sel[i]] : 0.0f;
    if (a.norm_topk && a.top_k > 1) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
    w = __fmul_rn(w, a.route_scale);
    a.ids[t * a.top_k + i] = sel[i];
    a.weights[t * a.top_k + i] = w;
  }
}

__global__ void swiglu_kernel(SwigluArgs a) {
  const int64_t total = a.rows * a.inter;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g = a.g[idx], u = a.u[idx];
    if (a.limit > 0.0f) {
      u = dev::clampf(u, -a.limit, a.limit);
      g = fminf(g, a.limit);
    }
    float act = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, dev::exp_ref(-g))), u);
    if (a.row_weight) act = __fmul_rn(a.row_weight[idx / a.inter], act);
    a.out[idx] = dev::bf16_round(act);
  }
}

__global__ void moe_combine_kernel(MoeCombineArgs a) {
  const int64_t total = a.n * a.dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / a.dim, d = idx % a.dim;
    const int32_t* ids = a.ids + t * a.top_k;
    float y = 0.0f;
    int last = -1;
    // slots in increasing expert id (top_k is small: repeated minimum)
    for (int64_t step = 0; step < a.top_k; ++step) {
      int best = -1, best_slot = -1;
      for (int64_t i = 0; i < a.top_k; ++i) {
        const int e = ids[i];
        if (e > last && (best < 0 || e < best)) best = e, best_slot = static_cast<int>(i);
      }
      if (best < 0) break;
      y = __fadd_rn(y, a.routed[(t * a.top_k + best_slot) * a.dim + d]);
      last = best;
    }
    a.out[idx] = dev::bf16_round(__fadd_rn(y, a.shared[idx]));
  }
}

unsigned elem_grid(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

namespace raw {
cudaError_t router(const RouterArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  // grid.y is limited to 65535 tokens: longer batches run in slices
  for (int64_t t0 = 0; t0 < a.n; t0 += 65535) {
    RouterArgs b = a;
    b.n = a.n - t0 < 65535 ? a.n - t0 : 65535;
    b.x = a.x + t0 * a.dim;
    b.ids = a.ids + t0 * a.top_k;
    b.weights = a.weights + t0 * a.top_k;
    b.scratch = a.scratch + t0 * 2 * a.n_experts;
    const dim3 grid(static_cast<unsigned>((a.n_experts + kRouterWarps - 1) / kRouterWarps), static_cast<unsigned>(b.n));
    router_scores_kernel<<<grid, kRouterWarps * 32, 0, s>>>(b);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    router_select_kernel<<<static_cast<unsigned>(b.n), 32, 0, s>>>(b);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t swiglu(const SwigluArgs& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  swiglu_kernel<<<elem_grid(a.rows * a.inter), 256, 0, s>>>(a);
  return cudaGetLastError();
}
cudaError_t moe_combine(const MoeCombineArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  moe_combine_kernel<<<elem_grid(a.n * a.dim), 256, 0, s>>>(a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
