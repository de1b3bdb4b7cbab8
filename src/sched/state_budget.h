// Sequence-state memory: the per-token and per-sequence bytes of MODEL.md §5.7 computed from the
// config (printed at start-up), and the pool sized by --kv-cache-gib that every sequence state is
// allocated from.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory_resource>
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

// The sequence-state pool (--kv-cache-gib). It is the memory resource every pooled sequence
// state is allocated from (Model::new_sequence(pool, capacity)): each byte the engine takes for a
// sequence is counted here when allocated and uncounted when the state returns it, so used_bytes()
// is the real size of all live states. Sequences get room in whole blocks of `block_tokens`
// context tokens (no per-token allocation); the scheduler admits, grows and preempts against
// fits(), which keeps used_bytes() at or below the capacity at every step boundary. The bytes
// themselves come from `upstream`, the memory the engine's states must live in
// (Model::state_memory(): the system allocator for host engines, so ASan/LSan see every buffer;
// device memory for the CUDA engine); the pool's job is the exact count and the limit, the same
// for every backend. While one buffer of a growing state is copied into its larger replacement
// both exist for a moment; peak_bytes() records that.
class StatePool final : public std::pmr::memory_resource {
 public:
  // `upstream` must outlive the pool.
  StatePool(int64_t capacity_bytes, int64_t block_tokens,
            std::pmr::memory_resource* upstream = std::pmr::new_delete_resource());
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;
  ~StatePool() override;

  int64_t block_tokens() const { return block_tokens_; }
  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  int64_t live_allocations() const { return live_.load(); }
  std::pmr::memory_resource* upstream() const { return upstream_; }
  // True when `more` bytes can be taken without passing the capacity.
  bool fits(int64_t more) const { return used_bytes() + more <= capacity_; }
  // Context room (tokens) for a sequence needing `tokens`: whole blocks, at most `limit`.
  int64_t room_for(int64_t tokens, int64_t limit) const;
  double usage() const;

 private:
  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* p, size_t bytes, size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  int64_t capacity_;
  int64_t block_tokens_;
  std::pmr::memory_resource* upstream_;
  std::atomic<int64_t> used_{0}, peak_{0}, live_{0};
};

}  // namespace dsv41::sched
