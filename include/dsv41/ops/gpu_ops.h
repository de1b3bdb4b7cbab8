// Validated entry points of the non-EXL3 CUDA ops (kernels/ops/): the numeric pieces of the
// FP8/FP4 forward path (MODEL.md §4-§5), each reproducing the CPU reference engine's rounding and
// summation order. Argument structs and layouts are documented in kernels/ops/ops_launch.h.
// Every function throws dsv41::Error with one precise message on bad arguments or a failed launch;
// launches are asynchronous, allocate nothing, and are graph-capturable (except where noted).
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstdint>

#include "dsv41/config/model_config.h"
#include "ops/moe_grouped.h"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {

// The HcMixArgs of one mHC site of model `c` (hc, dim, Sinkhorn iterations and epsilons from the
// config; the site's fn/base/scale; n rows of h into mix). The reference-call fields (t_ref0,
// rows_ref, k_parts) keep their defaults: the caller sets them.
HcMixArgs hc_mix_args(const ModelConfig& c, const float* h, int64_t n, const float* fn, const float* base,
                      const float* scale, float* mix);
// The RouterArgs of a MoE layer of model `c` (expert count, top-k, scoring, temperature,
// renormalisation and scale from the config; n rows of x; ids, weights and scratch [n][2E] out). A
// caller whose bank differs (a DSpark stage) sets n_experts / top_k after.
RouterArgs router_args(const ModelConfig& c, const float* x, int64_t n, const float* gate_w, const float* gate_bias,
                       int32_t* ids, float* weights, float* scratch);
void rms_norm(const RmsNormArgs& a, cudaStream_t s);
void rope(const RopeArgs& a, cudaStream_t s);
void qdq(const QdqArgs& a, cudaStream_t s);
void act_quant8(const ActQuantArgs& a, cudaStream_t s);
// Lin8 / Lin4 take the ActQuant8 output of their input rows.
void lin8(const Lin8Args& a, cudaStream_t s);
void lin4(const Lin4Args& a, cudaStream_t s);
// Up to kLinGroupMax linears over the same input codes in one launch (ops_launch.h), bit-identical
// to separate calls; a count of 1 is a plain call.
void lin8_group(const Lin8GroupArgs& a, cudaStream_t s);
void lin4_group(const Lin4GroupArgs& a, cudaStream_t s);
void lin_dense(const DenseArgs& a, cudaStream_t s);
void hc_mix(const HcMixArgs& a, cudaStream_t s);
void hc_collapse(const HcCollapseArgs& a, cudaStream_t s);
void hc_expand(const HcExpandArgs& a, cudaStream_t s);
void router(const RouterArgs& a, cudaStream_t s);
void swiglu(const SwigluArgs& a, cudaStream_t s);
void moe_combine(const MoeCombineArgs& a, cudaStream_t s);
// Routed FP4 experts as grouped tensor-core GEMMs (kernels/ops/moe_grouped.h): close to, not
// bit-identical with, lin4 + swiglu + act_quant8 + lin4 (the CPU engine's order inside 32-blocks).
void moe_grouped(const MoeGroupedArgs& a, cudaStream_t s);
void engram_dequant(const EngramDequantArgs& a, cudaStream_t s);
void engram_gate(const EngramGateArgs& a, cudaStream_t s);
void indexer_scores(const IndexerArgs& a, cudaStream_t s);
void topk_sorted(const TopkArgs& a, cudaStream_t s);
// The k entries model::topk_sorted keeps, tie order included, for the shapes topk_replay_fits
// takes: its nth_element branch (k·64 > n) up to n = 65535, its partial_sort branch (k·64 <= n)
// up to k = kTopkHeapMaxK; may consume the values (TopkReplayArgs).
constexpr int64_t kTopkHeapMaxK = 4096;
bool topk_replay_fits(int64_t n, int64_t k);
void topk_replay(const TopkReplayArgs& a, cudaStream_t s);
// The candidate source's kept blocks (model::candidate_mask's blocks, the block top-k by
// topk_replay, so ties as the CPU engine); needs topk_replay_fits(blocks, min(topk_blocks, blocks)).
void candidate_blocks(const CandidateArgs& a, cudaStream_t s);
void candidate_mask(const CandidateMaskArgs& a, cudaStream_t s);
// Sparse attention, one arithmetic, identical results: up to 32 queries take the split kernel (a
// cluster of blocks per query), more the tiled kernel (32 heads of a query per block); shapes
// neither takes fall back to the rows kernel with kPrefillHeads heads per block (prefill) or one
// (decode).
inline constexpr int kPrefillHeads = 4;
void sparse_attention_decode(const SparseAttnArgs& a, cudaStream_t s);
void sparse_attention_prefill(const SparseAttnArgs& a, cudaStream_t s);
void attn_lists(const AttnListArgs& a, cudaStream_t s);
void stage_window(const StageWindowArgs& a, cudaStream_t s);
void embed(const EmbedArgs& a, cudaStream_t s);
void argmax(const ArgmaxArgs& a, cudaStream_t s);
void compress_pool(const CompressPoolArgs& a, cudaStream_t s);
void store_bf16(const StoreBf16Args& a, cudaStream_t s);
void scale_round(const ScaleRoundArgs& a, cudaStream_t s);
void fill_pointers(const FillPointersArgs& a, cudaStream_t s);
// DSpark: target-layer taps and the Markov head's bias (ops_launch.h).
void stream_mean(const StreamMeanArgs& a, cudaStream_t s);
void markov_bias(const MarkovBiasArgs& a, cudaStream_t s);

// ---- compressor step (KV-source layers, ratio 1 and r > 1) ----
struct CompressorWeights {
  const void* wkv = nullptr;  // [hd][dim]: BF16 for ratio 1, F32 for ratio > 1
  DenseType wkv_type = DenseType::BF16;
  const float* wgate = nullptr;  // [hd][dim] F32 (ratio > 1)
  const float* norm = nullptr;   // [hd]
  const void* i_wk = nullptr;  // [ihd][hd] BF16 or F32; nullptr when the layer owns no index keys
  DenseType i_wk_type = DenseType::BF16;
  // The projections already ran (EXL3 weights, run by the caller): the scratch holds x·wkv rounded
  // to bf16 in `latent` (ratio 1), or x·wkv in `a` and x·wgate in `g` (ratio > 1); wkv/wgate unused.
  bool projected = false;
  const float* i_k_norm = nullptr;  // [ihd]
  int64_t dim = 0, hd = 0, ihd = 0, ratio = 1, rope_dim = 0;
  const float* freqs = nullptr;  // compressed RoPE table [rope_dim/2]
  float eps = 0.0f;
};
struct CompressorState {
  float* carry_kv = nullptr;     // [ratio][hd] (ratio > 1)
  float* carry_score = nullptr;  // [ratio][hd]
  uint16_t* compressed = nullptr;  // [capacity][hd] bf16 (QDQ4b values)
  uint16_t* index_keys = nullptr;  // [capacity][ihd] bf16 (QDQ4a values), when i_wk is set
  int64_t capacity = 0;
  int64_t n_entries = 0;  // advanced by compressor_step
};
struct CompressorScratch {
  float* a = nullptr;       // [max_tokens][hd]
  float* g = nullptr;       // [max_tokens][hd]
  float* latent = nullptr;  // [max_tokens][hd]
  float* work = nullptr;    // [max_tokens][max(hd, ihd)]
  int64_t max_tokens = 0;
};
// The compressor's input projections of n tokens (x: [n][dim]) into the scratch, as `projected`
// describes (row t at t·hd). Each row's arithmetic is its own (dense_stream.cu, lin_dense), so a
// batched decode pass projects its rows of every sequence in one call and steps each sequence's
// compressor with `projected` set, bit for bit as separate steps.
void compressor_project(const CompressorWeights& w, const CompressorScratch& scratch, const float* x, int64_t n,
                        cudaStream_t s);
// Runs the compressor over n tokens at positions start.. (x: [n][dim] bf16 values) and appends the
// emitted groups' compressed rows and index keys to the state. Returns the number of groups.
int64_t compressor_step(const CompressorWeights& w, CompressorState& st, const CompressorScratch& scratch,
                        const float* x, int64_t n, int64_t start, cudaStream_t s);

}  // namespace dsv41::ops::gpu
#endif
