// Grouped EXL3 MoE layer for a few tokens (decode, speculative verify: m <= 8). The grouped
// kernels take four launches, chained with programmatic dependent launch (each starts its trellis
// prefetch while the previous one finishes):
//   1. stage gate/up: x ⊙ suh, input Hadamard (and int8 quantisation) once per (selected expert,
//      projection, k-split) into the workspace.
//   2. gate_up: every (selected expert, gate|up, 128-column group, k-split) is one block; the last
//      block of an (expert, column group) applies both output Hadamards, svh, the clamped SwiGLU of
//      MODEL.md §5.5 (u clamped to ±limit, g clamped above at limit, silu(g)·u), the routing
//      weight, the down projection's suh and input Hadamard, and writes act_had.
//   3. stage down: act_had (int8 quantisation or fp16) once per (expert, k-split).
//   4. down: every (expert, 128-column group of the output, k-split) is one block; the last block
//      of a column group sums the experts in increasing expert id, shared expert last, and writes y.
// Experts are selected on the device from topk ids, so one graph serves every routing. Each
// matrix has its own K and codebook. Sums use fixed orders only (no floating-point atomics).
//
// Stream path (MoePlan::stream), when every gate/up matrix shares one K and codebook and every down
// matrix another (the usual checkpoint): three launches on the persistent stream-K body of the
// linear kernels (exl3_stream.cuh), whose one-wave grids walk all selected matrices' (column group,
// 128-row) units, so no wave is left a fraction full and the pipelines fill once per launch:
//   1. stage: x ⊙ suh, Hadamard, int8 or fp16 fragments once per (selected expert, projection).
//   2. gate/up: the end of each (expert, 128-column group) writes its outputs; the second of its
//      gate and up applies the clamped SwiGLU, the routing weight, the down suh and Hadamard, and
//      stages that chunk of the down projection's input.
//   3. down: the end of each (expert, column group) writes the expert's output; the last expert of
//      a column group sums them in slot order and writes y.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exl3/exl3_gemm.h"

namespace dsv41::exl3::cuda {

struct MoeParams {
  // Device arrays of n_experts (+1 with the shared expert at index n_experts) matrices.
  const Exl3Matrix* gate = nullptr;  // [hidden -> inter]
  const Exl3Matrix* up = nullptr;    // [hidden -> inter]
  const Exl3Matrix* down = nullptr;  // [inter -> hidden]
  int n_experts = 0;
  bool has_shared = false;
  int hidden = 0;    // padded k of gate/up and n of down
  int inter = 0;     // padded n of gate/up and k of down
  int max_bits = 0;  // largest K in the tables (sizes shared memory)
  float swiglu_limit = 10.0f;  // <= 0: no clamp
  // Round where the CPU reference engine rounds (block.cpp run_expert, MODEL.md §5.5): g and u, the
  // weighted activation (exact libm-grade exp in the SiLU), each expert's output, and the sum, to
  // bf16 values. Off: fp32 throughout, the kernels' own SiLU.
  bool bf16_points = false;

  const void* x = nullptr;  // [m][x_stride] activations, x_cols valid
  ActType x_type = ActType::BF16;
  int m = 0;
  int64_t x_cols = 0, x_stride = 0;
  const int32_t* topk_ids = nullptr;    // device [m][topk]; ids outside [0, n_experts) are skipped
  const float* topk_weights = nullptr;  // device [m][topk]
  int topk = 0;

  void* y = nullptr;  // [m][y_stride], y_cols written
  ActType y_type = ActType::F32;
  int64_t y_cols = 0, y_stride = 0;

  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int splits_gate_up = 0, splits_down = 0;  // the grouped kernels' k-splits; 0 = heuristic
  int int8 = -1;                            // -1 auto (m <= 4 and MUL1), 0 never
  // Kinds the caller knows every matrix has (host facts): bits and codebook of all gate and up
  // matrices, and of all down matrices; bits 0 = they differ. The stream path needs both.
  int gate_up_bits = 0, gate_up_codebook = 0, down_bits = 0, down_codebook = 0;
  int stream = -1;  // -1 auto (the kinds are uniform), 0 never, 1 required
};

struct MoePlan {
  bool int8 = false;
  int max_slots = 0;
  int splits_gu = 1, kt_gu = 0;
  int splits_dn = 1, kt_dn = 0;
  size_t smem_gu = 0, smem_dn = 0;
  size_t workspace = 0;
  // Stream path: int8 or f16 fragments per projection, persistent grids (blocks).
  bool stream = false;
  bool int8_gu = false, int8_dn = false;
  int grid_gu = 0, grid_dn = 0;
};

// Shared by planner and launcher.
size_t moe_workspace_bytes(const MoeParams& p, const MoePlan& plan);
size_t moe_smem_bytes(int max_bits, int rows);
cudaError_t launch_moe(const MoeParams& p, const MoePlan& plan, cudaStream_t stream);
// Stream path: resident blocks per SM of the stream kernel of this kind (0 when none), the
// workspace and the launches (exl3_moe_stream.cu).
int moe_stream_blocks_per_sm(int bits, int codebook, bool int8);
size_t moe_stream_workspace_bytes(const MoeParams& p, const MoePlan& plan);
cudaError_t launch_moe_stream(const MoeParams& p, const MoePlan& plan, cudaStream_t stream);

}  // namespace dsv41::exl3::cuda
