// The FP4 expert banks (Lin4) at decode sizes on the tensor cores (kernels/ops/lin4_tc_gemv.cu):
// calls whose pairs must not depend on each other (Lin4Args::row_invariant: decode steps, DSpark
// drafts) and that allow tensor-core block sums (no exact_block_sums). raw::lin4_group sends a call
// here when lin4_tc_gemv_takes() says so.
//
// The numerics are the sequential kernel's except inside a 32-wide block: a block's 32 code products
// (e2m1 · e4m3, each exact in fp32) are summed by two chained m16n8k16 MMAs from zero instead of a
// sequential fma chain, then, as on the CPU, term = (part · x_scale) · w_scale and the terms are
// added in increasing K order from zero. The two sums agree unless one of them rounds (a block's
// products need more than fp32's 24 bits side by side), the licence the prefill passes' grouped
// MoE GEMM already takes (ops/tc_block.cuh): outputs are bit-identical to the CPU on most rows and
// within the bound of tests/gpu_ops/lin4_tc_gemv_test.cpp on the rest. A block's placement in the
// MMAs is fixed, so a pair's bits depend on its token and expert only: never on the other pairs,
// the batch, the launch grid or whether banks run grouped.
#pragma once
#include <cuda_runtime.h>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// Whether lin4_group hands this call to lin4_tc_gemv: the kernel is on (default; DSV41_LIN4_TC_GEMV=0
// turns it off, read at the first call, or set_lin4_tc_gemv), row_invariant set, exact_block_sums
// not, in % 128 == 0 and in <= 8192, at most kLinGroupMax banks, 16-byte aligned packed weights and activation
// codes, 4-byte aligned weight scales, and a layout that fits the device's shared memory.
bool lin4_tc_gemv_takes(const Lin4GroupArgs& g);
// Turns the kernel on (1) or off (0) for the process (tests, benchmarks); returns the previous
// setting. Off, row-invariant calls take the sequential sums.
int set_lin4_tc_gemv(int on);
// The kernel for a group of up to three banks over the same input codes and expert ids.
cudaError_t lin4_tc_gemv(const Lin4GroupArgs& g, cudaStream_t s);

}  // namespace dsv41::ops::gpu::raw
