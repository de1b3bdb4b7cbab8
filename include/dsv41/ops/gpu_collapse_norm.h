// Validated entry point of the fused mHC collapse + RMSNorm (kernels/ops/collapse_norm.h): the
// pair of gpu::hc_collapse and gpu::rms_norm in place on the collapse's output rows, as one op.
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include "ops/collapse_norm.h"

namespace dsv41::ops::gpu {
// hc_collapse(c) then rms_norm(n) in place on c.out: needs n.x == n.out == c.out, strides of c.dim,
// n.rows == c.n and n.d == c.dim, plus everything hc_collapse and rms_norm check. Throws
// dsv41::Error on bad arguments or a failed launch.
void hc_collapse_rms_norm(const HcCollapseArgs& c, const RmsNormArgs& n, cudaStream_t s);
}  // namespace dsv41::ops::gpu
#endif
