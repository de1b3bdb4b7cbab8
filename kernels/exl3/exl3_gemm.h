// EXL3 linear on the GPU: y = ((x ⊙ suh)·B_k · W_hat · B_n) ⊙ svh + bias (EXL3.md §3.1), with the
// trellis decoded in registers. Host-side launcher; device code in exl3_gemm_kernel.cuh.
//
// Paths (chosen by ops::exl3_gemm_plan, or forced):
//   int8   m <= 4, MUL1 only. x_had is quantised per 128-row chunk to two int8 levels (hi + lo/254,
//          about 16 bits of precision relative to the chunk's amax); the MUL1 byte sum is folded
//          into a u8 x s8 tensor-core product, so each weight costs one state extraction + one IMAD.
//          Values are the affine MUL1 codebook (no per-weight fp16 rounding, <= 2^-12 relative).
//   f16    m <= 8, any codebook: bit-exact fp16 decode, one m16n8k16 mma per tile for all rows.
//   large  m > 8: x_had is formed once by a prologue kernel; each decoded tile feeds 64 rows.
// The small paths stage x once per call in a small first kernel, then run a persistent stream-K
// kernel (exl3_stream.cuh) of about one wave whose blocks walk contiguous ranges of
// (column group, 128-row) units; a batched call (GemmParams::batch) puts several matrices' units in
// one such grid. The large path splits k across blocks. Partial sums are reduced
// in a fixed order by the last block of each output group (no floating-point atomics), so results
// are bitwise repeatable. The two launches of a small-path call use programmatic dependent launch
// (set DSV41_EXL3_NO_PDL in the environment to launch them plainly).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dsv41::exl3::cuda {

enum class ActType : int { F16 = 0, BF16 = 1, F32 = 2 };

// One EXL3 linear resident on the device (all pointers device memory).
struct Exl3Matrix {
  const uint16_t* trellis = nullptr;  // [k/16][n/16][16*bits] tiles (EXL3.md §2.1)
  const uint16_t* suh = nullptr;      // [k] fp16
  const uint16_t* svh = nullptr;      // [n] fp16
  const uint16_t* bias = nullptr;     // [n] fp16, may be nullptr
  int32_t k = 0, n = 0;               // padded sizes, multiples of 128
  int32_t bits = 0;                   // K, 1..8
  int32_t codebook = 2;               // 0 = 3INST, 1 = MCG, 2 = MUL1
};

enum class GemmPath : int { Auto = 0, F16 = 1, Int8 = 2, Large = 3 };

struct GemmPlan {
  GemmPath path = GemmPath::Auto;
  int splits = 1;        // large: k-splits per output group; small: blocks per output group (about)
  int kt_per_split = 0;  // large: k-tiles (16 rows) per split, a multiple of 8; small: 8 (one unit)
  int m_blocks = 1;      // row blocks (large path: 64 rows each)
  int grid = 0;          // small paths: persistent blocks (<= units = batch * n/128 * k/128)
  int batch = 1;         // matrices of a batched small-path call
  size_t workspace = 0;  // bytes of workspace needed
};

struct GemmParams {
  Exl3Matrix w;
  const void* x = nullptr;  // [m][x_stride], x_cols valid values per row (zero-extended to k)
  ActType x_type = ActType::F16;
  int64_t m = 0, x_cols = 0, x_stride = 0;
  void* y = nullptr;  // [m][y_stride], first y_cols columns written (padded columns trimmed)
  ActType y_type = ActType::F16;
  int64_t y_cols = 0, y_stride = 0;
  void* workspace = nullptr;  // zeroed once by gemm_workspace_init; reusable across calls
  size_t workspace_bytes = 0;
  bool round_bf16 = false;  // round each output to a bf16 value before storing (the reference's rounding)
  // Batched small paths (m <= 8): `batch` matrices of w's shape, bits and codebook in one staging
  // and one stream launch (w is a host copy of the first; batch_w the device array of all of them),
  // matrix i reading x + i·x_batch_stride and writing y + i·y_batch_stride (elements). The units of
  // all matrices share one stream-K grid, so several small linears cost about one launch.
  int batch = 1;
  const Exl3Matrix* batch_w = nullptr;
  int64_t x_batch_stride = 0, y_batch_stride = 0;
  GemmPath path = GemmPath::Auto;  // force a path (tests, benchmark)
  int splits = 0;                  // force a k-split count / blocks per group (0 = heuristic)
};

// Launches one planned problem (2 kernels: x staging or input transform, then the matmul).
// Graph-capturable, no host synchronisation. Trusts its arguments: validation and planning live
// in dsv41/ops/exl3_gpu.h.
// `plan.path` must be resolved (not Auto). Returns the launch status.
cudaError_t launch_gemm(const GemmParams& p, const GemmPlan& plan, cudaStream_t stream);

// W_hat [k][n] fp16 decoded by the kernels' decoder (one warp per tile).
cudaError_t launch_reconstruct(const Exl3Matrix& w, uint16_t* w_hat, cudaStream_t stream);

// Workspace layout shared by planner and launcher.
constexpr size_t kCounterBytes = 64 * 1024;  // ticket counters, zeroed once, reset by kernels
constexpr int kMaxSmallRows = 1024;          // k rows one MoE block covers (x staged in smem)
constexpr int kLargeRows = 64;               // rows per block on the large path
size_t gemm_workspace_bytes(const Exl3Matrix& w, int64_t m, const GemmPlan& plan);
size_t gemm_smem_bytes(const Exl3Matrix& w, GemmPath path);
// Resident blocks per SM of the small-path stream kernel for this matrix (occupancy query).
int stream_blocks_per_sm(const Exl3Matrix& w, GemmPath path);

}  // namespace dsv41::exl3::cuda
