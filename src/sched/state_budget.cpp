#include "sched/state_budget.h"

#include <algorithm>

#include <spdlog/spdlog.h>

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

StatePool::StatePool(int64_t capacity_bytes, int64_t block_tokens, std::pmr::memory_resource* upstream)
    : capacity_(capacity_bytes), block_tokens_(block_tokens), upstream_(upstream) {
  DSV_CHECK(block_tokens > 0, "state pool: block size must be positive, got {}", block_tokens);
  DSV_CHECK(capacity_bytes > 0, "state pool: capacity must be positive, got {} bytes", capacity_bytes);
  DSV_CHECK(upstream != nullptr, "state pool: no upstream memory resource");
}

StatePool::~StatePool() {
  // Every state must be gone before its pool (the scheduler declares the pool first). The bytes
  // belong to the upstream resource, so a straggler is still freed correctly there; it is a
  // bookkeeping bug to report.
  if (live_.load() != 0)
    spdlog::error("state pool destroyed with {} live allocations ({} bytes)", live_.load(), used_.load());
}

int64_t StatePool::room_for(int64_t tokens, int64_t limit) const {
  const int64_t t = std::max<int64_t>(tokens, 0);
  const int64_t blocks = (t + block_tokens_ - 1) / block_tokens_;
  return std::max(t, std::min(blocks * block_tokens_, limit));
}

double StatePool::usage() const {
  return static_cast<double>(used_bytes()) / static_cast<double>(capacity_);
}

void* StatePool::do_allocate(size_t bytes, size_t alignment) {
  // Counted only once the upstream delivered: a refused allocation (it throws) changes nothing.
  void* p = upstream_->allocate(bytes, alignment);
  const int64_t now = used_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  ++live_;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void StatePool::do_deallocate(void* p, size_t bytes, size_t alignment) {
  upstream_->deallocate(p, bytes, alignment);
  used_.fetch_sub(static_cast<int64_t>(bytes));
  --live_;
}

}  // namespace dsv41::sched
