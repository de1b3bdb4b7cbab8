// Sequence-state memory: the per-token and per-sequence bytes of MODEL.md §5.7 computed from the
// config, and a block-granular pool sized by --kv-cache-gib that the scheduler admits, grows and
// preempts sequences against (no per-token allocation: a sequence takes whole blocks).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41::sched {

struct StateBytes {
  // Growth per context token over all layers (compressed KV + index keys of the KV sources).
  int64_t packed_per_token = 0;  // bit-faithful packed layout (e2m1 values + scales)
  int64_t bf16_per_token = 0;    // as the reference stores it (BF16)
  // Fixed per sequence: window rings of every layer and DSpark stage, compressor carries, Engram
  // history.
  int64_t packed_fixed = 0;
  int64_t bf16_fixed = 0;
};

StateBytes state_bytes(const ModelConfig& c);

// Block-granular accounting of the state pool. Capacity and all requests are in tokens; a block
// holds `block_tokens` tokens of growth; each sequence also holds `fixed_blocks` for its fixed
// state.
class StatePool {
 public:
  StatePool(int64_t pool_bytes, int64_t per_token_bytes, int64_t fixed_bytes, int64_t block_tokens);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t total_blocks() const { return total_blocks_; }
  int64_t free_blocks() const { return free_blocks_; }
  int64_t fixed_blocks() const { return fixed_blocks_; }
  // Tokens one sequence alone can hold (after its fixed state).
  int64_t capacity_tokens() const { return (total_blocks_ - fixed_blocks_) * block_tokens_; }
  // Blocks a sequence of `tokens` context needs in total (fixed part included).
  int64_t blocks_for(int64_t tokens) const;
  bool try_take(int64_t blocks);
  void give_back(int64_t blocks);
  double usage() const;

 private:
  int64_t block_tokens_;
  int64_t block_bytes_;
  int64_t fixed_blocks_;
  int64_t total_blocks_;
  int64_t free_blocks_;
};

}  // namespace dsv41::sched
