// The model interface: what the scheduler/server sees of a backend (CPU reference, CUDA, TP).
// A Model owns its weights; a SeqState owns one sequence's incremental state (window rings,
// compressed KV, index keys, compressor carries, Engram history, DSpark window).
#pragma once
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <span>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41 {

struct SeqState {
  virtual ~SeqState() = default;
  int64_t n_past = 0;  // tokens already processed; the next token sits at this position
  // Total prompt length when a prompt is prefilled in several chunks (0 = unknown). Chunks then use
  // the index-list layout of a one-shot prefill of the whole prompt, so chunked == one-shot; a
  // one-token step at or beyond this length is a decode step.
  int64_t prompt_len = 0;
};

struct ForwardItem {
  SeqState* state = nullptr;
  std::span<const int32_t> tokens;  // new tokens, at positions state->n_past, n_past+1, ...
  bool all_logits = false;          // true: one logits row per token; false: last token only
  std::vector<float>* logits = nullptr;  // out: [rows, vocab] fp32 (resized by forward)
  // Optional out, for a greedy sampler that needs nothing but the pick (only with all_logits
  // false): the caller sets it to -1; a backend that can picks the last row's first maximum
  // (std::max_element: NaN never wins over a number) where the logits are, writes its id here and
  // leaves `logits` untouched. A backend that does not, fills `logits` as usual.
  int32_t* greedy_id = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // A sequence state on the heap that grows as needed (tools, tests).
  virtual std::unique_ptr<SeqState> new_sequence() const = 0;

  // ---- sequence state drawn from a pool the caller owns (the server's --kv-cache-gib pool) ----
  // A state whose every buffer is allocated from `memory` (and returned to it when the state is
  // destroyed), with room for `capacity_tokens` context tokens: exactly
  // state_bytes(capacity_tokens) bytes are taken. A pooled state never allocates while tokens fit;
  // forward() refuses tokens beyond its capacity. The defaults throw: a backend the server runs
  // must implement all three.
  virtual std::unique_ptr<SeqState> new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const;
  // Grows (never shrinks) a pooled state's room to `capacity_tokens`; afterwards the state holds
  // exactly state_bytes(capacity_tokens) bytes of `memory`. Contents are kept.
  virtual void reserve_sequence(SeqState& state, int64_t capacity_tokens) const;
  // Bytes a pooled state with room for `capacity_tokens` tokens holds (the real allocation sizes).
  virtual int64_t state_bytes(int64_t capacity_tokens) const;
  // Where the bytes of pooled states must come from: the server's pool counts and limits them but
  // takes them from this resource. Host engines use the heap; a GPU engine returns device memory
  // (pointers the host never dereferences), so one pool serves every backend.
  virtual std::pmr::memory_resource& state_memory() const { return *std::pmr::new_delete_resource(); }
  // Runs a batch: every item advances its own sequence by its tokens (chunked prefill or decode).
  // Throws dsv41::Error for bad input (token id out of range, context exceeded); the states of a
  // batch that threw are unspecified and must be discarded.
  virtual void forward(std::span<ForwardItem> batch) = 0;
};

}  // namespace dsv41
