// Manifold hyper-connections, single-pass form (MODEL.md §5.2): the mixing coefficients of a site
// computed from its input streams (Sinkhorn-normalised comb), and the collapse/expand steps.
#pragma once
#include <cstdint>

namespace dsv41::model {

struct HcMix {
  float pre[16], post[16], comb[16 * 16];  // comb[j*hc + k]: row j = input stream, col k = output
};

// How the reference's PyTorch evaluates one token's mixes at the last ulp:
//  - the mixes GEMM F.linear(x, hc_fn) over K = hc·dim in fp32: the BLAS accumulates each K part
//    with a sequential fused multiply-add chain and adds the parts in K order; k_parts is a
//    resolved order of dsv41/model/mix_gemm_parts.h (0 = chains of 256, -1 = the blocked order,
//    P > 0 = P parts of 64-element units);
//  - torch.sigmoid on pre/post: the first `sigmoid_vector` of the token's hc entries fall in the
//    vector body of the elementwise kernel (ops/vec_math.h), the rest in its scalar tail.
struct HcMixArithmetic {
  int64_t sigmoid_vector = 16;
  int64_t k_parts = 0;
};

// The arithmetic for token t_ref of a reference call over rows_ref tokens (its pre/post tensors
// hold rows_ref·hc contiguous elements).
HcMixArithmetic hc_mix_arithmetic(int64_t hc, int64_t t_ref, int64_t rows_ref, int64_t k_parts);

// h: [hc][dim] bf16 values; fn: [(2+hc)·hc][hc·dim]; base: [(2+hc)·hc]; scale: [3].
void hc_mix(const float* h, int64_t hc, int64_t dim, const float* fn, const float* base, const float* scale,
            int64_t sinkhorn_iters, double hc_eps, double norm_eps, HcMix& out);
void hc_mix(const float* h, int64_t hc, int64_t dim, const float* fn, const float* base, const float* scale,
            int64_t sinkhorn_iters, double hc_eps, double norm_eps, const HcMixArithmetic& arith, HcMix& out);
// Split of the mixes (already scaled by the rsqrt) into pre/post/comb with Sinkhorn.
void hc_split_sinkhorn(const float* mixes, int64_t hc, const float* base, const float* scale,
                       int64_t sinkhorn_iters, double hc_eps, HcMix& out);
void hc_split_sinkhorn(const float* mixes, int64_t hc, const float* base, const float* scale,
                       int64_t sinkhorn_iters, double hc_eps, const HcMixArithmetic& arith, HcMix& out);
// fp32 dot over n values in the reference BLAS order described by HcMixArithmetic::k_parts.
float hc_gemm_dot(const float* a, const float* b, int64_t n, int64_t k_parts);
// bf16( Σ_j w[j]·h[j] )
void hc_collapse(const float* h, const float* w, int64_t hc, int64_t dim, float* out);
// h[k] ← bf16( post[k]·y + Σ_j comb[j][k]·h[j] ) (in place)
void hc_expand(const float* y, float* h, const HcMix& mix, int64_t hc, int64_t dim);

}  // namespace dsv41::model
