// Argument validation of the fused mHC collapse + RMSNorm (include/dsv41/ops/gpu_collapse_norm.h).
#include "dsv41/ops/gpu_collapse_norm.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_buffer.h"
#include "ops/gpu_norm_checks.h"

namespace dsv41::ops::gpu {

void hc_collapse_rms_norm(const HcCollapseArgs& c, const RmsNormArgs& n, cudaStream_t s) {
  constexpr const char* kOp = "hc_collapse_rms_norm";
  check_hc_collapse_args(c, kOp);
  DSV_CHECK(n.rows == c.n && n.d == c.dim, "{}: norm rows={} d={} against collapse n={} dim={}", kOp, n.rows, n.d, c.n,
            c.dim);
  DSV_CHECK(n.x == c.out && n.out == c.out && n.x_stride == c.dim && n.out_stride == c.dim,
            "{}: the norm must run in place on the collapse's packed output rows", kOp);
  DSV_CHECK(!n.rope.freqs && !n.qdq8, "{}: no fused rope or qdq8", kOp);
  check_rms_norm_args(n, kOp);
  check_cuda(raw::hc_collapse_rms_norm(c, n, s), "hc_collapse_rms_norm launch");
}

}  // namespace dsv41::ops::gpu
#endif
