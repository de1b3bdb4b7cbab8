// The mHC collapse and the RMSNorm of its rows in one launch (the decode sites' pair: attention
// and FFN input, the final norm). Kept out of ops_launch.h so that adding it recompiled no other
// kernel; the argument structs are that header's.
#pragma once
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {
// hc_collapse(c) then rms_norm(n) over its rows, in place: n.x == n.out == c.out, rows of c.dim
// packed (n.x_stride == n.out_stride == c.dim), n.rows == c.n, n.d == c.dim. Every output (out,
// codes, scales, bf16_out) is as the two launches write it; the collapsed rows themselves are not
// kept (the norm overwrites them in place anyway). Decode-sized batches take one cluster launch,
// other sizes the two kernels.
cudaError_t hc_collapse_rms_norm(const HcCollapseArgs& c, const RmsNormArgs& n, cudaStream_t s);
}  // namespace dsv41::ops::gpu::raw
