#include "sched/state_budget.h"

#include <algorithm>

#include "dsv41/common/error.h"

namespace dsv41::sched {

StateBytes state_bytes(const ModelConfig& c) {
  StateBytes b;
  const int64_t d = c.head_dim, di = c.index_head_dim;
  // Packed record sizes (MODEL.md §5.7): window slot = d e4m3 + one ue8m0 per 32; compressed
  // entry = d e2m1 (d/2 bytes) + one e4m3 scale per 16; index key = di e2m1 + one ue8m0 per 32.
  const int64_t window_slot_packed = d + d / 32, window_slot_bf16 = 2 * d;
  const int64_t entry_packed = d / 2 + d / 16, entry_bf16 = 2 * d;
  const int64_t key_packed = di / 2 + di / 32, key_bf16 = 2 * di;
  for (int64_t L : c.kv_source_layer_ids) {
    const int64_t r = c.ratio(L);
    if (r <= 0) continue;
    // One compressed entry and one index key per r tokens (the average growth per token).
    b.packed_per_token += (entry_packed + key_packed) / r;
    b.bf16_per_token += (entry_bf16 + key_bf16) / r;
    // A ratio-r compressor keeps the pending group's (kv, gate) rows in fp32.
    if (r > 1) {
      b.packed_fixed += 2 * r * d * 4;
      b.bf16_fixed += 2 * r * d * 4;
    }
  }
  const int64_t window_layers = c.num_hidden_layers + c.num_nextn_predict_layers;  // backbone + DSpark
  b.packed_fixed += window_layers * c.sliding_window * window_slot_packed;
  b.bf16_fixed += window_layers * c.sliding_window * window_slot_bf16;
  const int64_t engram_history = std::max<int64_t>(0, c.engram_max_ngram_size - 1) * 4;  // int32 ids
  b.packed_fixed += engram_history;
  b.bf16_fixed += engram_history;
  return b;
}

StatePool::StatePool(int64_t pool_bytes, int64_t per_token_bytes, int64_t fixed_bytes, int64_t block_tokens)
    : block_tokens_(block_tokens) {
  DSV_CHECK(block_tokens > 0 && per_token_bytes > 0, "state pool: bad block geometry");
  block_bytes_ = per_token_bytes * block_tokens;
  fixed_blocks_ = (fixed_bytes + block_bytes_ - 1) / block_bytes_;
  total_blocks_ = pool_bytes / block_bytes_;
  free_blocks_ = total_blocks_;
}

int64_t StatePool::blocks_for(int64_t tokens) const {
  return fixed_blocks_ + (std::max<int64_t>(tokens, 0) + block_tokens_ - 1) / block_tokens_;
}

bool StatePool::try_take(int64_t blocks) {
  if (blocks > free_blocks_) return false;
  free_blocks_ -= blocks;
  return true;
}

void StatePool::give_back(int64_t blocks) {
  free_blocks_ += blocks;
  DSV_ASSERT(free_blocks_ <= total_blocks_, "state pool: {} blocks returned twice", blocks);
}

double StatePool::usage() const {
  return total_blocks_ ? 1.0 - static_cast<double>(free_blocks_) / static_cast<double>(total_blocks_) : 0.0;
}

}  // namespace dsv41::sched
