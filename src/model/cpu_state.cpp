// Sizes of a pooled CPU sequence state. The window rings, DSpark rings, compressor carries,
// Engram history and DSpark taps have a fixed size; compressed KV entries and index keys grow by
// one per `ratio` tokens, so a state with room for T tokens holds floor(T / ratio) of each. The
// buffers are fp32 (the reference keeps QDQ'd values widened), not the packed layout of
// MODEL.md §5.7: state_bytes() is what this engine really takes from the pool.
#include <algorithm>

#include "dsv41/common/error.h"
#include "model/cpu_impl.h"

namespace dsv41::model {

namespace {

// Buffer element counts of one state (fixed ones, and the growing ones for `tokens`).
struct StateShape {
  int64_t fixed_floats = 0, growing_floats = 0, history_ids = 0;
};

StateShape shape_of(const CpuModel::Impl& m, int64_t tokens) {
  const ModelConfig& c = m.cfg;
  StateShape s;
  const int64_t ring = c.sliding_window * c.head_dim;
  s.fixed_floats += (c.num_hidden_layers + static_cast<int64_t>(m.dspark.size())) * ring;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t r = c.ratio(l);
    if (c.is_kv_source(l) && r > 1) s.fixed_floats += 2 * r * c.head_dim;  // carry_kv + carry_score
    const AttnWeights& a = m.blocks[static_cast<size_t>(l)].attn;
    if (r <= 0 || !a.c_wkv) continue;
    const int64_t entries = tokens / r;
    s.growing_floats += entries * c.head_dim;
    if (a.i_wk) s.growing_floats += entries * c.index_head_dim;
  }
  if (!m.dspark.empty()) s.fixed_floats += static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
  if (!m.engram_hash.empty()) s.history_ids = std::max<int64_t>(0, c.engram_max_ngram_size - 1);
  return s;
}

}  // namespace

int64_t CpuModel::Impl::state_bytes(int64_t capacity_tokens) const {
  DSV_CHECK(capacity_tokens >= 0, "sequence capacity must not be negative, got {}", capacity_tokens);
  const StateShape s = shape_of(*this, capacity_tokens);
  return (s.fixed_floats + s.growing_floats) * static_cast<int64_t>(sizeof(float)) +
         s.history_ids * static_cast<int64_t>(sizeof(int64_t));
}

void CpuModel::Impl::reserve_state(CpuSeqState& st, int64_t capacity_tokens) const {
  DSV_CHECK(capacity_tokens >= 0, "sequence capacity must not be negative, got {}", capacity_tokens);
  const ModelConfig& c = cfg;
  if (st.capacity_tokens >= capacity_tokens) return;
  // reserve() allocates exactly the requested element count (then frees the old buffer), so each
  // buffer's capacity equals what state_bytes() counts for it.
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t r = c.ratio(l);
    const AttnWeights& a = blocks[static_cast<size_t>(l)].attn;
    if (r <= 0 || !a.c_wkv) continue;
    KvSourceState& k = st.kv[static_cast<size_t>(l)];
    const int64_t entries = capacity_tokens / r;
    k.compressed.reserve(static_cast<size_t>(entries * c.head_dim));
    if (a.i_wk) k.index_keys.reserve(static_cast<size_t>(entries * c.index_head_dim));
  }
  if (!engram_hash.empty()) st.engram_history.reserve(static_cast<size_t>(std::max<int64_t>(0, c.engram_max_ngram_size - 1)));
  if (!dspark.empty())
    st.last_taps.reserve(static_cast<size_t>(static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size));
  st.capacity_tokens = capacity_tokens;
}

}  // namespace dsv41::model
