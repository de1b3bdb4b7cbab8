// Tensor-core Lin8 GEMM for prefill passes (kernels/ops/lin8_tc_gemm.cu). lin8_gemm (lin_gemm.cu)
// hands a call here when the call allows tensor-core block sums (exact_block_sums == false) and has
// enough rows; each 32-wide block is summed by the canonical arrangement of ops/tc_block.cuh (or, on
// the scaled path by default, the whole K of a weight group whose scales allow it), so an output is
// the same bits whatever the tile, m, or the other parts of a group.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops_launch.h"

namespace dsv41::ops::gpu::raw {

// CTA tiles (weight rows x tokens): 1 = 128x128 (8 warps), 2 = 64x64 (4 warps).
constexpr int kLin8TcTiles = 2;

// Whether the kernel can run this group: K a multiple of 32, 16-byte aligned codes, the weight
// scales of a CTA's rows over all of K fit in its shared memory, and some tile fits the device's.
bool lin8_tc_gemm_supported(const Lin8GroupArgs& g);
// Whether tile `tile` fits the device's shared memory for inputs of `in` (GB10: tile 2 only).
bool lin8_tc_gemm_tile_fits(int tile, int64_t in);
// Modelled time (µs, H200) of this call on the faster tile, which *tile (if not null) receives.
double lin8_tc_gemm_us(const Lin8GroupArgs& g, int* tile);
// Runs the group with CTA tile `tile` (1..kLin8TcTiles; 0 = the time model's choice). The caller
// has checked lin8_tc_gemm_supported; a tile that does not fit returns cudaErrorInvalidValue.
cudaError_t lin8_tc_gemm(const Lin8GroupArgs& g, int tile, cudaStream_t s);

}  // namespace dsv41::ops::gpu::raw
