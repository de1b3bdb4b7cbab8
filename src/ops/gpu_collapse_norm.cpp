// Argument validation of the fused mHC collapse + RMSNorm (include/dsv41/ops/gpu_collapse_norm.h).
#include "dsv41/ops/gpu_collapse_norm.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_buffer.h"

namespace dsv41::ops::gpu {

void hc_collapse_rms_norm(const HcCollapseArgs& c, const RmsNormArgs& n, cudaStream_t s) {
  DSV_CHECK(c.hc >= 1 && c.hc <= 16 && c.dim > 0 && c.n >= 0, "hc_collapse_rms_norm: hc={} dim={}", c.hc, c.dim);
  DSV_CHECK(c.n == 0 || (c.h && c.w && c.out && n.w), "hc_collapse_rms_norm: h, w, out and the norm weight must be device pointers");
  DSV_CHECK(n.rows == c.n && n.d == c.dim, "hc_collapse_rms_norm: norm rows={} d={} against collapse n={} dim={}", n.rows,
            n.d, c.n, c.dim);
  DSV_CHECK(n.x == c.out && n.out == c.out && n.x_stride == c.dim && n.out_stride == c.dim,
            "hc_collapse_rms_norm: the norm must run in place on the collapse's packed output rows");
  DSV_CHECK(!n.codes == !n.scales, "hc_collapse_rms_norm: codes and scales go together");
  DSV_CHECK(!n.codes || n.d % 32 == 0, "hc_collapse_rms_norm: quantised output needs d={} to be a multiple of 32", n.d);
  DSV_CHECK(!n.rope.freqs && !n.qdq8, "hc_collapse_rms_norm: no fused rope or qdq8");
  DSV_CHECK(!n.bf16_out || n.bf16_stride >= n.d, "hc_collapse_rms_norm: bf16 copy stride {} below d={}", n.bf16_stride, n.d);
  check_cuda(raw::hc_collapse_rms_norm(c, n, s), "hc_collapse_rms_norm launch");
}

}  // namespace dsv41::ops::gpu
#endif
