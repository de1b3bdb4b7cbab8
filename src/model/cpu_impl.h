// Internals of the CPU reference engine (include/dsv41/model/cpu_model.h): weights as the
// reference holds them after loading, the per-sequence state, and the per-forward scratch that
// carries the index sources' top-k lists and candidate masks down the stack.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/engram/row_store.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/linear.h"
#include "model/engram_hash.h"
#include "model/ops/rope.h"

namespace dsv41::model {

struct HcWeights {
  std::vector<float> fn;     // [(2+hc)·hc][hc·dim]
  std::vector<float> base;   // [(2+hc)·hc]
  std::vector<float> scale;  // [3]
};

struct AttnWeights {
  std::unique_ptr<Linear> wq_a, wq_b, wkv, wo_b;
  std::vector<std::unique_ptr<Linear>> wo_a;  // one BF16 linear per output group
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
  std::vector<float> gate_w;     // [n_experts][dim] fp32
  std::vector<float> gate_bias;  // [n_experts]
  std::vector<Expert> experts;
  Expert shared;
};

struct EngramWeights {
  int64_t hash_index = 0;  // position in engram_layer_ids
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
};

// State of one KV-source layer's compressed cache.
struct KvSourceState {
  int64_t n_entries = 0;
  std::vector<float> compressed;  // [n][head_dim], QDQ4b values
  std::vector<float> index_keys;  // [n][index_head_dim], QDQ4a values (layers with index keys)
  std::vector<float> carry_kv, carry_score;  // [ratio][head_dim] fp32 (ratio > 1)
};

struct CpuSeqState final : SeqState {
  std::vector<std::vector<float>> ring;    // [layer] -> [window][head_dim]
  std::vector<KvSourceState> kv;           // [layer] (only KV sources used)
  std::vector<int64_t> engram_history;     // compressed ids of the last max_ngram-1 tokens, oldest first
  int64_t last_key_publisher = -1;         // KV source whose index keys were published last
  std::vector<std::vector<float>> dspark_ring;  // [stage] -> [window][head_dim]
  std::vector<float> last_taps;            // DSpark taps of position n_past-1 [n_targets·dim]
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
  const TensorInfo* head = nullptr;   // [vocab][dim]
  std::vector<float> final_norm;
  std::vector<BlockWeights> blocks;   // backbone
  std::vector<BlockWeights> dspark;   // mtp stages
  DsparkHeadWeights dspark_head;
  std::vector<EngramLayerHash> engram_hash;
  std::vector<int32_t> token_map;
  int64_t engram_pad = 0;
  std::shared_ptr<engram::EngramStore> engram_store;  // table rows (src/engram)

  void load(const std::string& dir);
  void load_block(BlockWeights& b, const std::string& prefix, int64_t layer, bool dspark);

  void check_state(const SeqState& s) const;
  CpuSeqState& state_of(SeqState& s) const;
  const CpuSeqState& state_of(const SeqState& s) const;
  std::unique_ptr<CpuSeqState> make_state() const;

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
  void update_dspark_rings(CpuSeqState& st, const float* taps, int64_t n, int64_t start) const;
};

// Context of a DSpark block forward: which stage, and the target position before the block.
struct DsparkContext {
  int64_t stage = 0;
  int64_t anchor_pos = 0;  // P: the block rows sit at P+1 ..
  const CpuSeqState* state = nullptr;
};

// ---- small shared helpers (src/model/ops/basic.cpp) ----
// RMSNorm over d values: bf16( w · (x · rsqrt(mean(x²) + eps)) ).
void rms_norm(const float* x, const float* w, int64_t d, double eps, float* out);
// Widens a BF16/F32 tensor to fp32 after checking its shape.
std::vector<float> load_f32(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape);
// Row `r` of a 2-D BF16/F32 tensor widened to fp32.
void tensor_row_f32(const TensorInfo& t, int64_t r, float* out);

}  // namespace dsv41::model
