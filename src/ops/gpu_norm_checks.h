// Argument checks of the mHC collapse and the RMSNorm, shared by their own entry points
// (gpu_ops.cpp) and the fused collapse + RMSNorm (gpu_collapse_norm.cpp), which must accept no
// argument that either op alone rejects. Each throws dsv41::Error whose message starts with `op`.
#pragma once
#if DSV41_HAS_CUDA
#include "dsv41/ops/gpu_ops.h"

namespace dsv41::ops::gpu {
// hc in 1..16, dim > 0, n >= 0, device pointers h, w and out when there are rows.
void check_hc_collapse_args(const HcCollapseArgs& a, const char* op);
// Rows and width, device pointers, strides, codes with scales, the widths the quantised output and
// the fused RoPE / QDQ8 tail need, and the bf16 copy's stride.
void check_rms_norm_args(const RmsNormArgs& a, const char* op);
}  // namespace dsv41::ops::gpu
#endif
