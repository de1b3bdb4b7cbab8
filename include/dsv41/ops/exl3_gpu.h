// Validated entry points of the EXL3 CUDA kernels (kernels/exl3/). Available when the build has
// CUDA (DSV41_HAS_CUDA). Every function throws dsv41::Error with one precise message on bad
// arguments or a failed launch; launches are asynchronous and graph-capturable.
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exl3/exl3_gemm.h"
#include "exl3/exl3_grouped.h"
#include "exl3/exl3_moe.h"

namespace dsv41::ops {

using exl3::cuda::ActType;
using exl3::cuda::Exl3Matrix;
using exl3::cuda::GemmParams;
using exl3::cuda::GemmPath;
using exl3::cuda::GemmPlan;
using exl3::cuda::GroupedGemmParams;
using exl3::cuda::GroupedInputParams;
using exl3::cuda::GroupedTile;
using exl3::cuda::grouped_row_class;
using exl3::cuda::MoeParams;

// SM count of the current device (cached per device).
int current_sm_count();

// Path and work split for y = x·W with m rows; `path`/`splits` force a choice (0 = heuristic):
// `splits` is the k-split count on the large path and the blocks per column group (persistent
// stream-K grid) on the small paths.
// `batch` > 1: a batched small-path call (GemmParams::batch; m <= 8).
GemmPlan exl3_gemm_plan(const Exl3Matrix& w, int64_t m, GemmPath path = GemmPath::Auto, int splits = 0,
                        int batch = 1);

// The most rows one call can take: the large path keeps a ticket counter per (column group, block
// of rows) in the workspace's fixed counter space, so a wide matrix (the 129,280-column head) takes
// ~1,024 rows a call; callers run more rows in calls of at most this many.
int64_t exl3_gemm_max_rows(const Exl3Matrix& w);

// Workspace bytes that cover every auto-planned call with 1..m_max rows.
size_t exl3_gemm_workspace_bytes(const Exl3Matrix& w, int64_t m_max);

// Zeroes a freshly allocated workspace (its ticket counters); kernels keep it reusable.
void exl3_workspace_init(void* workspace, size_t bytes, cudaStream_t stream);

// y = x·W (+ bias). Plans with p.path / p.splits / p.batch, validates shapes, pointers and the
// workspace (a batch's matrices are checked on the device against p.w's shape, bits and codebook:
// a mismatch stops the staging kernel).
void exl3_gemm(const GemmParams& p, cudaStream_t stream);

// Decodes W_hat [k][n] fp16 (bit-exact with EXL3.md §2.6) with the kernels' own decoder.
void exl3_reconstruct(const Exl3Matrix& w, uint16_t* w_hat, cudaStream_t stream);

// Grouped linears over rows sorted by matrix (see exl3_grouped.h): the inputs of every set, then one
// launch per (bits, codebook, row class) of tiles. The device arrays (src_row, matrix_of, tiles, out_row)
// are the caller's: their entries are trusted, and a tile whose matrix is not of the launch's class
// and shape stops the kernel (a device trap).
void exl3_grouped_input(const GroupedInputParams& p, cudaStream_t stream);
void exl3_grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream);

// One MoE layer for m <= 8 tokens: three launches on the stream path, four otherwise (exl3_moe.h).
size_t exl3_moe_workspace_bytes(const MoeParams& p);
void exl3_moe(const MoeParams& p, cudaStream_t stream);

}  // namespace dsv41::ops
#endif
