// Start-up of the bare form (server rank 0 and worker ranks): the memory budget items the process
// is about to allocate, computed before anything large is touched, and the pass that brings the
// mapped weights into memory with a progress indicator.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/runtime/memory_budget.h"
#include "dsv41/runtime/memory_source.h"

namespace dsv41::runtime {

struct ServeMemoryPlan {
  uint64_t weight_bytes = 0;      // dense + expert weights of the whole checkpoint (Engram tables excluded)
  int world_size = 1;             // tensor-parallel ranks: each holds about 1/world_size of the weights
  double kv_cache_gib = 0.0;      // --kv-cache-gib (sequence-state pool)
  double engram_cache_gib = 0.0;  // --engram-cache-gib (row cache)
  int64_t max_num_seqs = 1;
  int64_t max_num_batched_tokens = 1;
};

// Bytes of the tensors this process maps as weights: everything but the Engram tables, which are
// read row by row (--engram-dir / --engram-packed / in place).
uint64_t checkpoint_weight_bytes(const Checkpoint& ck);

// The budget table's items for the CPU engine: weights, sequence-state pool, workspaces (per
// sequence logits rows plus the activations of a full step: an upper estimate), CUDA graphs and
// NCCL buffers (none on the CPU backend: listed as 0 so the table has the same rows everywhere),
// Engram cache.
std::vector<BudgetItem> serve_budget_items(const ModelConfig& cfg, const ServeMemoryPlan& p);

// ---- the CUDA engine (--device cuda) ----

// CUDA devices this process can use: 0 when the build has no CUDA or no device answers (then
// `why`, when given, says which).
int cuda_device_count(std::string* why = nullptr);

struct CudaDeviceInfo {
  std::string name;
  uint64_t free_bytes = 0, total_bytes = 0;
  bool integrated = false;  // shares system memory with the CPU (DGX Spark): MemAvailable is the truth
};
// Throws dsv41::Error when the device cannot be queried (or the build has no CUDA).
CudaDeviceInfo cuda_device_info(int device);

// What "available" means for a CUDA engine: the device's free memory (cudaMemGetInfo) on a
// discrete GPU; MemAvailable where the GPU shares system memory.
MemorySource cuda_memory_source(int device);

// Device bytes of the CUDA model's scratch arena for `chunk_tokens` tokens per pass and contexts up
// to `max_context`: the size src/cuda_model alloc_scratch allocates, from the same layout
// (dsv41/model/cuda_scratch_plan.h: common buffers + the largest of the layer's phases; logits for
// min(chunk_tokens, logit_rows) rows (CudaModelOptions::max_logit_rows), the indexer's score rows in
// slices of score_slice_bytes (CudaModelOptions::index_score_slice_bytes): one slice of up to
// chunk_tokens full rows, or two of at least one row each). tensor_parallel: a rank's arena (one
// more row set of routed rows).
uint64_t cuda_scratch_bytes(const ModelConfig& cfg, int64_t chunk_tokens, int64_t max_context,
                            int64_t logit_rows = 256, int64_t score_slice_bytes = model::kIndexScoreSliceBytes,
                            bool tensor_parallel = false);

// Device bytes of the DSpark drafter's own buffers for passes of `chunk_tokens` rows (the taps of
// its target layers, its input rows, ring KV row, pre-mix rows, ids, positions and attention lists:
// src/cuda_model/cuda_dspark.cpp load_dspark); 0 when the config has no DSpark stages.
uint64_t cuda_dspark_scratch_bytes(const ModelConfig& cfg, int64_t chunk_tokens);

// Tokens per forward pass of a serving CUDA engine (CudaModelOptions::max_chunk_tokens, which sizes
// the scratch arena): a step's prefill chunk or decode batch never holds more than
// --max-num-batched-tokens tokens, so longer passes would only grow the arena (a forward longer
// than a pass, such as a DSpark drafter pass over many sequences, is split into passes); the
// drafter needs one block per pass. Tensor-parallel ranks keep `default_tokens`: each rank reads
// its own flags, and all must split a forward into the same passes.
int64_t cuda_serve_pass_tokens(const ModelConfig& cfg, const ServeMemoryPlan& p, int64_t default_tokens);

// The budget table's items for the CUDA engine on one device: all weights (uploaded once), the
// sequence-state pool (device memory), the scratch arena as workspaces, CUDA graphs and NCCL
// buffers (none yet: 0). The Engram row cache is host memory: it is an item here only when
// `unified` (one memory for both), otherwise cuda_host_budget_items() holds it.
std::vector<BudgetItem> cuda_serve_budget_items(const ModelConfig& cfg, const ServeMemoryPlan& p, int64_t chunk_tokens,
                                                int64_t max_context, bool unified);
// Host-side items of a CUDA engine on a discrete GPU (checked against MemAvailable).
std::vector<BudgetItem> cuda_host_budget_items(const ServeMemoryPlan& p);

// Reads every page of the weight tensors once (not the Engram tables) so the first request does
// not fault them in from disk; reports progress ("loading weights", bytes) and returns the bytes
// touched.
uint64_t preload_weights(const Checkpoint& ck);

}  // namespace dsv41::runtime
