// Start-up of the bare form (server rank 0 and worker ranks): the memory budget items the process
// is about to allocate, computed before anything large is touched, and the pass that brings the
// mapped weights into memory with a progress indicator.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/runtime/memory_budget.h"

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

// Reads every page of the weight tensors once (not the Engram tables) so the first request does
// not fault them in from disk; reports progress ("loading weights", bytes) and returns the bytes
// touched.
uint64_t preload_weights(const Checkpoint& ck);

}  // namespace dsv41::runtime
