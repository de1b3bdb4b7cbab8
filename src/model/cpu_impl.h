// Internals of the CPU reference engine (include/dsv41/model/cpu_model.h): weights as the
// reference holds them after loading, the per-sequence state, and the per-forward scratch that
// carries the index sources' top-k lists and candidate masks down the stack.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/engram/row_store.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/linear.h"
#include "model/engram_hash.h"
#include "model/ops/rope.h"

namespace dsv41::dist {
class Collective;
}

namespace dsv41::model {

struct HcWeights {
  std::vector<float> fn;     // [(2+hc)·hc][hc·dim]
  std::vector<float> base;   // [(2+hc)·hc]
  std::vector<float> scale;  // [3]
};

struct AttnWeights {
  std::unique_ptr<Linear> wq_a, wq_b, wkv, wo_b;
  std::vector<std::unique_ptr<Linear>> wo_a;  // one BF16 linear per output group (this rank's groups)
  // Tensor parallel: this rank's attention heads [head_begin, head_begin + n_heads) and output
  // groups [group_begin, group_begin + wo_a.size()); wq_b and sink hold only these heads, wo_b is
  // column-parallel. TP 1: all heads and groups.
  int64_t head_begin = 0, n_heads = 0, group_begin = 0;
  std::vector<float> q_norm, kv_norm, sink;
  // compressor (KV sources)
  std::unique_ptr<Linear> c_wkv, c_wgate;  // c_wgate only for ratio > 1 (both then fp32)
  std::vector<float> c_norm;
  // indexer: wq_b/weights_proj on index sources; wk/k_norm where the layer owns index keys
  std::unique_ptr<Linear> i_wq_b, i_weights_proj, i_wk;
  std::vector<float> i_k_norm;
};

struct Expert {
  std::unique_ptr<Linear> w1, w2, w3;
};

struct MoeWeights {
  int64_t n_experts = 0, top_k = 0;
  int64_t expert_begin = 0, expert_end = 0;  // routed experts this rank holds (others stay empty)
  std::vector<float> gate_w;     // [n_experts][dim] fp32
  std::vector<float> gate_bias;  // [n_experts]
  std::vector<Expert> experts;
  Expert shared;
};

struct EngramWeights {
  int64_t hash_index = 0;  // position in engram_layer_ids
  int64_t col_begin = 0, col_end = 0;  // hash columns whose table rows this rank reads (engram_share)
  std::unique_ptr<Linear> wkv;  // [(hc+1)·dim][n_cols·head_dim]
  std::vector<float> gate_w;    // fp32(q_weight)·fp32(k_weight) [hc][dim]
};

struct BlockWeights {
  std::string prefix;   // "layers.L" or "mtp.s"
  int64_t layer = 0;    // index into compress_ratios
  int64_t ratio = 0;
  bool is_dspark = false;
  RopeTable rope;
  std::vector<float> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttnWeights attn;
  MoeWeights ffn;
  std::unique_ptr<EngramWeights> engram;
};

struct DsparkHeadWeights {
  std::unique_ptr<Linear> main_proj;     // [dim][n_targets·dim] (stage 0)
  std::vector<float> main_norm;          // stage 0
  std::vector<float> norm;               // last stage
  const TensorInfo* markov_embed = nullptr;  // [vocab][rank] bf16
  const TensorInfo* markov_head = nullptr;   // [vocab][rank] (widened to fp32 on use)
  std::vector<float> confidence;         // [dim + rank] fp32
  // Set instead of markov_head / confidence when the checkpoint stores them as EXL3 linears.
  std::unique_ptr<Linear> markov_head_linear, confidence_linear;
};

// Sequence-state buffers are std::pmr vectors: a pooled state (Model::new_sequence(memory, cap))
// draws every buffer from the server's state pool and sizes it once for its capacity; a tool's
// state uses the heap and grows freely. The per-layer bookkeeping arrays stay on the heap.
using StateBuffer = std::pmr::vector<float>;

// State of one KV-source layer's compressed cache.
struct KvSourceState {
  int64_t n_entries = 0;
  StateBuffer compressed;  // [n][head_dim], QDQ4b values
  StateBuffer index_keys;  // [n][index_head_dim], QDQ4a values (layers with index keys)
  StateBuffer carry_kv, carry_score;  // [ratio][head_dim] fp32 (ratio > 1)
};

struct CpuSeqState final : SeqState {
  // Buffers must be built with their resource: assigning a pmr vector keeps the old resource.
  explicit CpuSeqState(std::pmr::memory_resource* m = std::pmr::new_delete_resource())
      : engram_history(m), last_taps(m), memory(m) {}
  CpuSeqState(const CpuSeqState&) = delete;  // copies go through make_state + assignment
  CpuSeqState& operator=(const CpuSeqState&) = default;

  std::vector<StateBuffer> ring;           // [layer] -> [window][head_dim]
  std::vector<KvSourceState> kv;           // [layer] (only KV sources used)
  std::pmr::vector<int64_t> engram_history;  // compressed ids of the last max_ngram-1 tokens, oldest first
  int64_t last_key_publisher = -1;         // KV source whose index keys were published last
  std::vector<StateBuffer> dspark_ring;    // [stage] -> [window][head_dim]
  StateBuffer last_taps;                   // DSpark taps of position n_past-1 [n_targets·dim]
  // Where the buffers come from, and the context tokens they were sized for (-1: heap, grows).
  std::pmr::memory_resource* memory = std::pmr::new_delete_resource();
  int64_t capacity_tokens = -1;
};

// Index sources' outputs, handed down the stack within one forward.
struct ChunkShared {
  std::vector<std::vector<int32_t>> topk;       // [query] -> compressed indices (-1 = none)
  std::vector<std::vector<uint8_t>> candidates;  // [query] -> mask over the scored entries
  bool has_candidates = false;
};

struct CpuModel::Impl {
  ModelConfig cfg;
  CpuModelOptions opts;
  std::unique_ptr<Checkpoint> ckpt;
  const TensorInfo* embed = nullptr;  // [vocab][dim]
  const TensorInfo* head = nullptr;   // [vocab][dim] dense (BF16/F16/F32), or null when head_linear is set
  std::unique_ptr<Linear> head_linear;  // an EXL3 head (`head.trellis`, EXL3.md §1.8)
  std::vector<float> final_norm;
  std::vector<BlockWeights> blocks;   // backbone
  std::vector<BlockWeights> dspark;   // mtp stages
  DsparkHeadWeights dspark_head;
  std::vector<EngramLayerHash> engram_hash;
  std::vector<int32_t> token_map;
  int64_t engram_pad = 0;
  std::shared_ptr<engram::EngramStore> engram_store;  // table rows (src/engram)
  // Tensor parallel (src/model/tp_parts.cpp, docs/TENSOR_PARALLEL.md); TP 1: tp null, world 1.
  dist::Collective* tp = nullptr;
  int tp_rank = 0, tp_world = 1;
  int64_t vocab_begin = 0, vocab_end = 0;  // head rows this rank holds (dense head)

  void load(const std::string& dir);
  void load_block(BlockWeights& b, const std::string& prefix, int64_t layer, bool dspark);

  void check_state(const SeqState& s) const;
  CpuSeqState& state_of(SeqState& s) const;
  const CpuSeqState& state_of(const SeqState& s) const;
  // memory: where the buffers come from; capacity_tokens < 0: heap state that grows as needed.
  std::unique_ptr<CpuSeqState> make_state(std::pmr::memory_resource* memory = std::pmr::new_delete_resource(),
                                          int64_t capacity_tokens = -1) const;
  // Sizes the growing buffers (compressed KV, index keys) for `capacity_tokens` (src/model/cpu_state.cpp).
  void reserve_state(CpuSeqState& st, int64_t capacity_tokens) const;
  int64_t state_bytes(int64_t capacity_tokens) const;

  // ---- forward pieces (src/model/*.cpp) ----
  void forward(CpuSeqState& st, const int32_t* tokens, int64_t n, bool all_logits, std::vector<float>* logits,
               BlockDump* dump) const;
  // h: [n][hc][dim]; pre: [n][hc] in/out.
  void block_forward(const BlockWeights& b, CpuSeqState& st, ChunkShared& shared, float* h, float* pre, int64_t n,
                     int64_t start, const struct DsparkContext* dctx) const;
  void attention(const BlockWeights& b, CpuSeqState& st, ChunkShared& shared, const float* x, int64_t n, int64_t start,
                 float* out) const;
  void dspark_attention(const BlockWeights& b, int64_t stage, const CpuSeqState& st, const float* x, int64_t n,
                        int64_t anchor_pos, float* out) const;
  void moe(const MoeWeights& w, const float* x, int64_t n, float* out) const;
  // h: [n][hc][dim] streams, updated in place; hash_rows: [n][n_cols] table rows of this layer;
  // rows_fetch: the prefetch holding them (EngramStore::prefetch, issued before layer 0).
  void engram(const EngramWeights& w, const int64_t* hash_rows, const engram::EngramFetch& rows_fetch, float* h,
              int64_t n) const;
  void head_logits(const float* x, int64_t n, float* logits) const;
  // Grouped low-rank output (this rank's groups, gathered under TP) and wo_b: o [n][local heads·hd].
  void attn_output(const AttnWeights& a, const float* o, int64_t n, float* out) const;
  // ---- tensor parallel pieces (src/model/tp_parts.cpp) ----
  void tp_split_block(BlockWeights& b, const std::string& prefix, bool is_dspark);
  // Routed experts under TP: y [n][dim] += every selected expert's output, summed in expert order.
  void tp_moe_routed(const MoeWeights& w, const float* x, int64_t n, const std::vector<std::vector<int64_t>>& sel,
                     const std::vector<std::vector<float>>& wts, float* y) const;
  void tp_head_logits(const float* x, int64_t n, float* logits) const;
  // z of this rank's output groups [n][local groups·R] -> every group's [n][G·R].
  void tp_gather_groups(const float* z_local, int64_t n, float* z) const;
  // Dequantised table rows of this rank's columns, gathered: rows [n][cols·head_dim].
  void tp_engram_rows(const EngramWeights& w, const int64_t* local_ids, const engram::EngramFetch& fetch, int64_t n,
                      float* rows) const;
  void update_dspark_rings(CpuSeqState& st, const float* taps, int64_t n, int64_t start) const;
};

// Context of a DSpark block forward: which stage, and the target position before the block.
struct DsparkContext {
  int64_t stage = 0;
  int64_t anchor_pos = 0;  // P: the block rows sit at P+1 ..
  const CpuSeqState* state = nullptr;
};

// Expert(x, wt): SwiGLU with the reference's clamps; routed experts scale by wt (src/model/block.cpp).
void run_expert(const Expert& e, const float* x, int64_t n, const float* wt, double limit, float* y);

// ---- small shared helpers (src/model/ops/basic.cpp) ----
// RMSNorm over d values: bf16( w · (x · rsqrt(mean(x²) + eps)) ).
void rms_norm(const float* x, const float* w, int64_t d, double eps, float* out);
// The experts' clamped SwiGLU over rows x inter values: u clamped to ±limit and g capped at limit
// (limit > 0), silu(g)·u, times the row's routing weight when `row_weight` is given, bf16-rounded.
// `out` may alias g.
void swiglu_rows(const float* g, const float* u, const float* row_weight, int64_t rows, int64_t inter, double limit,
                 float* out);
// Widens a BF16/F32 tensor to fp32 after checking its shape.
std::vector<float> load_f32(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape);
// Row `r` of a 2-D BF16/F32 tensor widened to fp32.
void tensor_row_f32(const TensorInfo& t, int64_t r, float* out);

}  // namespace dsv41::model
