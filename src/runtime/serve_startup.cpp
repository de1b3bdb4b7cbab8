#include "runtime/serve_startup.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "dsv41/common/error.h"
#include "dsv41/runtime/progress.h"

namespace dsv41::runtime {

uint64_t checkpoint_weight_bytes(const Checkpoint& ck) {
  uint64_t n = 0;
  for (const TensorInfo* t : ck.tensors())
    if (!is_engram_table_tensor(t->name)) n += t->nbytes;
  return n;
}

std::vector<BudgetItem> serve_budget_items(const ModelConfig& c, const ServeMemoryPlan& p) {
  DSV_CHECK(p.world_size >= 1, "memory budget: world size must be at least 1");
  const uint64_t f32 = sizeof(float);
  const uint64_t seqs = static_cast<uint64_t>(std::max<int64_t>(p.max_num_seqs, 1));
  const uint64_t step = static_cast<uint64_t>(std::max<int64_t>(p.max_num_batched_tokens, 1));
  const uint64_t dim = static_cast<uint64_t>(c.hidden_size), hc = static_cast<uint64_t>(c.hc_mult);
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
  // Each running sequence keeps one logits row; a step holds its residual streams [tokens][hc][dim]
  // and about a dozen temporaries of that size in fp32 (norms, attention, MoE inputs/outputs).
  const uint64_t workspaces = seqs * vocab * f32 + 16 * step * hc * dim * f32;
  return {
      {budget_item::kWeights, p.weight_bytes / static_cast<uint64_t>(p.world_size)},
      {budget_item::kSequenceStatePool, gib_to_bytes(p.kv_cache_gib, "--kv-cache-gib")},
      {budget_item::kWorkspaces, workspaces},
      {budget_item::kCudaGraphs, 0},
      {budget_item::kNcclBuffers, 0},
      {budget_item::kEngramCache, gib_to_bytes(p.engram_cache_gib, "--engram-cache-gib")},
  };
}

uint64_t preload_weights(const Checkpoint& ck) {
  std::vector<const TensorInfo*> weights;
  uint64_t total = 0;
  for (const TensorInfo* t : ck.tensors())
    if (!is_engram_table_tensor(t->name) && t->data != nullptr && t->nbytes > 0) {
      weights.push_back(t);
      total += t->nbytes;
    }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  Progress progress("loading weights", total);
  volatile uint8_t sink = 0;
  for (const TensorInfo* t : weights) {
    // Ask for read-ahead of the whole range, then touch one byte per page in order.
    const auto base = reinterpret_cast<uintptr_t>(t->data);
    const uintptr_t start = base & ~(page - 1);
    madvise(reinterpret_cast<void*>(start), t->nbytes + (base - start), MADV_WILLNEED);
    constexpr uint64_t kChunk = uint64_t{64} << 20;
    for (uint64_t off = 0; off < t->nbytes; off += kChunk) {
      const uint64_t end = std::min(t->nbytes, off + kChunk);
      for (uint64_t b = off; b < end; b += page) sink = sink + t->data[b];
      progress.advance(end - off);
    }
  }
  progress.finish();
  (void)sink;
  return total;
}

}  // namespace dsv41::runtime
