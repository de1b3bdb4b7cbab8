// Manifold hyper-connections, single-pass form (MODEL.md §5.2): the mixing coefficients of a site
// computed from its input streams (Sinkhorn-normalised comb), and the collapse/expand steps.
#pragma once
#include <cstdint>

namespace dsv41::model {

struct HcMix {
  float pre[16], post[16], comb[16 * 16];  // comb[j*hc + k]: row j = input stream, col k = output
};

// h: [hc][dim] bf16 values; fn: [(2+hc)·hc][hc·dim]; base: [(2+hc)·hc]; scale: [3].
void hc_mix(const float* h, int64_t hc, int64_t dim, const float* fn, const float* base, const float* scale,
            int64_t sinkhorn_iters, double hc_eps, double norm_eps, HcMix& out);
// Split of the mixes (already scaled by the rsqrt) into pre/post/comb with Sinkhorn.
void hc_split_sinkhorn(const float* mixes, int64_t hc, const float* base, const float* scale,
                       int64_t sinkhorn_iters, double hc_eps, HcMix& out);
// bf16( Σ_j w[j]·h[j] )
void hc_collapse(const float* h, const float* w, int64_t hc, int64_t dim, float* out);
// h[k] ← bf16( post[k]·y + Σ_j comb[j][k]·h[j] ) (in place)
void hc_expand(const float* y, float* h, const HcMix& mix, int64_t hc, int64_t dim);

}  // namespace dsv41::model
