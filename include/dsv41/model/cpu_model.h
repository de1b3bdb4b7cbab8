// The CPU reference engine: DeepSeek-V4.1's text forward pass and DSpark drafter exactly as
// MODEL.md §4–§6 describes (the numerical truth for every GPU kernel). Readable, not fast.
//
// Sequence state and chunking (see docs in src/model/README.md):
//  - A CpuSeqState carries everything a later token needs: window rings, compressed KV and index
//    keys of the KV sources, ratio>1 compressor carries, the Engram n-gram history, the DSpark
//    window rings and the last position's DSpark taps.
//  - forward() accepts any chunk length at any n_past. n_past == 0 reproduces the reference's
//    whole-prompt prefill; a one-token step at n_past > 0 reproduces its decode step; a multi-token
//    chunk at n_past > 0 uses the prefill index-list layout (MODEL.md §8 question 4).
//  - Speculative decoding: snapshot a state with clone_state() before a verify forward, and
//    restore_state() plus a forward over the accepted tokens to roll back.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv41/engram/open.h"
#include "dsv41/model/model.h"

namespace dsv41::dist {
class Collective;
}

namespace dsv41::model {

struct CpuModelOptions {
  // File holding an int32 `token_map` (token id -> Engram compressed id). Required when the
  // config has Engram layers.
  std::string engram_token_map;
  // Where Engram table rows come from (--engram-dir / --engram-packed / --engram-cache-gib, and the
  // tensor-parallel rank). engram_store, when set, is used as is (shared between models/ranks).
  engram::EngramStorageOptions engram_storage;
  std::shared_ptr<engram::EngramStore> engram_store;
  // Load the mtp.* DSpark stages (and keep their window rings in every sequence).
  bool dspark = true;
  // false (default): the reference's decode-time index-key alias (MODEL.md §5.4 "decode quirk");
  // true: every indexer scores against its own KV source's keys.
  bool corrected_index_keys = false;
  // K order of the reference's fp32 mixes GEMM in prefill (dsv41/model/mix_gemm_parts.h):
  // -2 = by the reference call's row count, as the reference's BLAS chose it (default); 0 = chains
  // of 256; -1 = the BLAS's blocked order (chains of 384, the rest halved); P > 0 = P parts of
  // 64-element units.
  int64_t mix_gemm_k_parts = -2;
  // Tensor parallel (docs/TENSOR_PARALLEL.md): this process is rank tp->rank() of
  // tp->world_size(); it loads only its share of the split weights and every forward /
  // dspark_draft is a collective call that all ranks make with the same arguments. null = TP 1.
  std::shared_ptr<dist::Collective> tp;
};

// Per-block stream dump of a forward (the debugging aid compared with golden prefill_block{i}_*).
struct BlockDump {
  std::vector<std::vector<float>> h;    // [layer] -> [tokens][hc_mult][dim] bf16 values
  std::vector<std::vector<float>> pre;  // [layer] -> [tokens][hc_mult]
  std::vector<int64_t> engram_hash_ids;  // [tokens][n_engram_layers][n_cols]
};

struct DsparkDraft {
  std::vector<int32_t> ids;        // block+1: the anchor, then the drafts (greedy)
  std::vector<float> logits;       // [block][vocab]: base logits + Markov bias
  std::vector<float> confidence;   // [block]: confidence logits (sigmoid -> P(accept))
};

class CpuModel final : public Model {
 public:
  static std::unique_ptr<CpuModel> load(const std::string& dir, const CpuModelOptions& opts);
  ~CpuModel() override;

  const ModelConfig& config() const override;
  std::unique_ptr<SeqState> new_sequence() const override;
  std::unique_ptr<SeqState> new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const override;
  void reserve_sequence(SeqState& state, int64_t capacity_tokens) const override;
  int64_t state_bytes(int64_t capacity_tokens) const override;
  void forward(std::span<ForwardItem> batch) override;

  // One sequence: advances `state` by `tokens`. logits (if not null) receives [rows][vocab] with
  // rows = tokens.size() when all_logits, else 1 (the last token). dump (if not null) receives the
  // streams after every block for these tokens.
  void forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                        std::vector<float>* logits, BlockDump* dump = nullptr) const;

  bool has_dspark() const;
  // Drafts after the target processed position P = n_past - 1 and sampled `anchor` (the token for
  // P+1): runs the DSpark block at positions P+1 .. P+block and the Markov/confidence heads. Uses
  // the DSpark rings, which forward_sequence fills for every position it processes. Does not
  // modify the state.
  DsparkDraft dspark_draft(const SeqState& state, int32_t anchor) const;

  // Deep copy of a sequence state (snapshot for speculative verification).
  std::unique_ptr<SeqState> clone_state(const SeqState& s) const;
  // Overwrites dst with src (both from this model).
  void restore_state(SeqState& dst, const SeqState& src) const;

  struct Impl;

 private:
  explicit CpuModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41::model
