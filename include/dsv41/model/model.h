// The model interface: what the scheduler/server sees of a backend (CPU reference, CUDA, TP).
// A Model owns its weights; a SeqState owns one sequence's incremental state (window rings,
// compressed KV, index keys, compressor carries, Engram history, DSpark window).
#pragma once
#include <cstdint>
#include <memory>
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
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::unique_ptr<SeqState> new_sequence() const = 0;
  // Runs a batch: every item advances its own sequence by its tokens (chunked prefill or decode).
  // Throws dsv41::Error for bad input (token id out of range, context exceeded); the states of a
  // batch that threw are unspecified and must be discarded.
  virtual void forward(std::span<ForwardItem> batch) = 0;
};

}  // namespace dsv41
