// The CUDA scratch arena's layout (include/dsv41/model/cuda_scratch_plan.h). Built without CUDA too:
// the start-up budget uses it on any host.
#include "dsv41/model/cuda_scratch_plan.h"

#include <algorithm>

#include "dsv41/common/error.h"

namespace dsv41::model {

const char* scratch_phase_name(ScratchPhase p) {
  switch (p) {
    case ScratchPhase::kCommon: return "common";
    case ScratchPhase::kAttention: return "attention";
    case ScratchPhase::kMoe: return "MoE";
    case ScratchPhase::kEngram: return "Engram";
    case ScratchPhase::kHead: return "head";
  }
  return "?";
}

Exl3SortLayout exl3_sort_layout(int64_t pairs, int64_t hidden, int64_t inter, int64_t experts) {
  auto pad = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
  Exl3SortLayout l;
  l.pairs = pairs;
  l.xh_bytes = pad(std::max(2 * pairs * pad(hidden, 128), pairs * pad(inter, 128)) * 2, 256);
  // An expert with c rows takes ceil(c / 64) <= (c + 63) / 64 tiles a set: at most
  // (pairs + 63 x the experts with rows) / 64 + 1 over a layer, in three sets.
  l.max_tiles = 3 * ((pairs + 63 * std::min(pairs, experts)) / 64 + 1);
  return l;
}

ScratchPlan plan_cuda_scratch(const ModelConfig& c, const ScratchPlanInputs& in) {
  DSV_CHECK(in.tokens >= 1 && in.max_context >= 1 && in.logit_rows >= 1 && in.score_slice_bytes >= 1,
            "CUDA scratch: chunk {}, context {}, logit rows {} and score slice bytes {} must be positive", in.tokens,
            in.max_context, in.logit_rows, in.score_slice_bytes);
  const int64_t m = in.tokens, dim = c.hidden_size, hc = c.hc_mult, mixw = (2 + hc) * hc;
  const int64_t qlr = c.q_lora_rank, H = c.num_attention_heads, hd = c.head_dim, ihd = c.index_head_dim;
  const int64_t IH = c.index_n_heads, win = c.sliding_window, GR = c.o_groups * c.o_lora_rank;
  // The DSpark stages may route over more experts / slots than the target layers.
  const int64_t inter = c.moe_intermediate_size, K = std::max(c.num_experts_per_tok, c.dspark_topk()),
                E = std::max(c.n_routed_experts, c.dspark_experts());
  const int64_t cols = c.n_engram_columns(), edim = cols * c.engram_head_dim, V = c.vocab_size;
  int64_t min_ratio = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.ratio(l) > 0 && (min_ratio == 0 || c.ratio(l) < min_ratio)) min_ratio = c.ratio(l);

  ScratchPlan p;
  p.m = m;
  p.logit_rows = std::min(m, in.logit_rows);
  p.t_max = min_ratio > 0 ? std::max<int64_t>(1, in.max_context / min_ratio) : 1;
  // Index score rows in slices (index_score_slicing): the buffers do not grow with m x t_max.
  p.slicing = index_score_slicing(m, p.t_max, in.score_slice_bytes);
  const int64_t tk = std::max<int64_t>(1, c.index_topk);
  // The device selects rows of any width (gpu::topk_replay_fits: both branches of the reference's
  // top-k), but keeps candidate masks only for sources of up to kDeviceCandidateColumns (16,384
  // blocks of the released config, a bit each per row); wider sources select their candidates on
  // the host (Impl::index_topk_on_device).
  if (c.candidate_source_layer_id >= 0 && c.candidate_block_size >= 1) {
    const int64_t widest = std::min(p.t_max, std::max(64 * tk - 1, kDeviceCandidateColumns));
    p.cand_blocks = std::max<int64_t>(1, (widest + c.candidate_block_size - 1) / c.candidate_block_size);
    p.cand_topk = std::max<int64_t>(1, std::min(c.candidate_topk_blocks, p.cand_blocks));
  }
  p.cand_rows = p.slicing.rows;
  const int64_t taps_in = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * dim;  // DSpark main_proj
  const int64_t max_in = std::max({dim, qlr, GR, inter, edim, H * hd, hd, taps_in});
  const int64_t code_bytes = std::max(m * max_in, m * K * inter);
  // Raw Engram rows (head_dim e4m3 codes and an E8M0 scale per 32: engram::EngramGeometry) of every
  // Engram layer for one pass, staged before the pass (Impl::engram_stage).
  const int64_t engram_row_bytes = c.engram_head_dim + (c.engram_head_dim + 31) / 32;
  p.engram_raw_bytes = static_cast<int64_t>(c.engram_layer_ids.size()) * m * cols * engram_row_bytes;
  // The tensor-core Lin8 GEMM's f16 rows (ops::gpu::lin8_rows16_bytes, kernels/ops/ops_launch.h; the
  // arena checks the two agree where CUDA is built) for the widest Lin8 input of a layer: x, the q
  // latent, wo_b's groups, the shared expert's intermediate, the Engram row set. A wider call (DSpark's
  // main_proj) takes the codes path. An EXL3 checkpoint has no Lin8 linears.
  p.rows16_in = c.quant.method == "exl3" ? 0 : std::max({dim, qlr, GR, inter, edim});
  p.rows16_bytes = p.rows16_in > 0 ? (m * p.rows16_in * 2 + 15) / 16 * 16 + m * 4 : 0;
  // gpu::moe_grouped_sort_ints(m * K, E) with 16-pair tiles (kernels/ops/moe_grouped.h; the arena
  // checks the two agree where CUDA is built): offsets, tile count, tile experts and starts, pairs.
  const int64_t pairs = m * K;
  p.moe_sort_ints = E + 2 + 2 * (pairs / 16 + std::min(pairs, E)) + pairs;

  using P = ScratchPiece;
  using S = ScratchPhase;
  const int64_t f = 4;
  // Why each piece is in its phase (cuda_forward.cpp, cuda_attention.cpp, cuda_moe.cpp,
  // cuda_decode_batch.cpp, cuda_dspark.cpp, cuda_exl3.cpp, cuda_tp.cpp):
  const ScratchPlanPiece table[] = {
      // ---- common: read across phases or layers, or holding values set at load ----
      {P::kH, S::kCommon, m * hc * dim * f},  // the residual streams: every phase, every layer
      {P::kPre, S::kCommon, m * hc * f},      // the carried pre weights, layer to layer
      // normed rows: attention and MoE inputs, the head's rows
      {P::kX, S::kCommon, m * dim * f},
      // a sublayer's output, read by the expand that follows it (outside the sublayer's phase)
      {P::kY, S::kCommon, m * dim * f},
      // mix_a is read by the MoE site's collapse after the attention; mix_f by the closing expand
      {P::kMixA, S::kCommon, m * mixw * f},
      {P::kMixF, S::kCommon, m * mixw * f},
      // every FP8/FP4 linear's input codes (Engram wkv, attention, MoE, DSpark main_proj after the head)
      {P::kCodes, S::kCommon, code_bytes},
      {P::kActScales, S::kCommon, (code_bytes / 32 + 1) * f},
      // codes of x: attention and MoE inputs, and DSpark's main_norm rows after the head
      {P::kXCodes, S::kCommon, m * dim},
      {P::kXScales, S::kCommon, (m * dim / 32 + 1) * f},
      {P::kTokens, S::kCommon, m * 4},                                // the embedding's ids, uploaded per pass
      {P::kSlots, S::kCommon, m * std::max<int64_t>(1, cols) * 4},    // identity filled once at load
      {P::kEngramRaw, S::kCommon, p.engram_raw_bytes},                // staged once, read by each Engram layer
      {P::kPositions, S::kCommon, m * 8},                 // batched decode: every layer and the DSpark rings
      {P::kMixCounters, S::kCommon, m * 4},               // zeroed at load, the mix kernel keeps them zero
      {P::kBatchPools, S::kCommon, c.num_hidden_layers * 2 * m * 8},  // batched decode: uploaded once per step
      // the top-k of an index source layer: the layers below the next index source attend to it
      // (PassShared::topk_len; batched decode: DecodeBatch::topk_off)
      {P::kTopk, S::kCommon, m * tk * 4},
      // the candidate source's kept blocks, applied by the index layers after it (device masks)
      {P::kCandKeep, S::kCommon, m * ((p.cand_blocks + 31) / 32) * 4},  // gpu::keep_words per row
      // a prefill Lin8 call's input in f16 rows (attention, shared expert, Engram wkv): as long as
      // the call runs, in every phase
      {P::kRows16, S::kCommon, p.rows16_bytes},
      // ---- attention: from the q latent to wo_b's output in y (DSpark stages the same); the host's
      // score reads and top-k writes go through pinned copies, in stream order ----
      {P::kQr, S::kAttention, m * qlr * f},
      {P::kQ, S::kAttention, m * H * hd * f},
      {P::kKv, S::kAttention, m * hd * f},  // read last by the ring update at the sublayer's end
      {P::kO, S::kAttention, m * H * hd * f},
      {P::kZ, S::kAttention, m * GR * f},
      {P::kKvBf16, S::kAttention, m * hd * 2},
      {P::kStaged, S::kAttention, (win - 1 + m) * hd * 2},
      {P::kQrCodes, S::kAttention, m * qlr},
      {P::kQrScales, S::kAttention, (m * qlr / 32 + 1) * f},
      {P::kCA, S::kAttention, m * hd * f},
      {P::kCG, S::kAttention, m * hd * f},
      {P::kCLatent, S::kAttention, m * hd * f},
      {P::kCWork, S::kAttention, m * std::max(hd, ihd) * f},
      {P::kQi, S::kAttention, m * IH * ihd * f},
      {P::kIw, S::kAttention, m * IH * f},
      {P::kScores, S::kAttention, p.slicing.floats() * f},
      // the device top-k's column indices beside one slice of scores (gpu::topk_replay)
      {P::kScoreIdx, S::kAttention, p.slicing.slice_floats() * 2},
      // the candidate source's block scores and block top-k, cand_rows rows at a time
      {P::kBlockScores, S::kAttention, p.cand_rows * p.cand_blocks * f},
      {P::kBlockIdx, S::kAttention, p.cand_rows * p.cand_blocks * 2},
      {P::kBlockSel, S::kAttention, p.cand_rows * p.cand_topk * 4},
      {P::kList, S::kAttention, m * (win + tk) * 4},
      {P::kPoolA, S::kAttention, m * 8},
      {P::kPoolB, S::kAttention, m * 8},
      // ---- MoE: router to combine; ids, routed and shared feed the closing expand (fused
      // combine), which runs before the next layer's first phase ----
      {P::kIds, S::kMoe, m * K * 4},
      {P::kRouteW, S::kMoe, m * K * f},
      {P::kRouteScratch, S::kMoe, m * 2 * E * f},
      {P::kEg, S::kMoe, m * K * inter * f},
      {P::kEu, S::kMoe, m * K * inter * f},
      // A split MoE layer (cuda_tp.cpp) keeps each pair of buffers it all-reduces back to back, so
      // one call covers both: the shared expert's rows right after the pass's routed rows (one
      // extra row set under tensor parallelism), su's rows right after sg's (Impl::moe_rows).
      {P::kRouted, S::kMoe, m * (K + (in.tensor_parallel ? 1 : 0)) * dim * f},
      {P::kSg, S::kMoe, 2 * m * inter * f},
      {P::kShared, S::kMoe, m * dim * f},
      {P::kMoeSort, S::kMoe, p.moe_sort_ints * 4},
      // an EXL3 checkpoint's large passes: the pairs' rows sorted by expert as the grouped GEMMs'
      // inputs, and their index (cuda_exl3.cpp moe_exl3_by_expert)
      {P::kExl3Rows, S::kMoe, c.quant.method == "exl3" ? exl3_sort_layout(pairs, dim, inter, E).bytes() : 0},
      // ---- Engram: the layer's dequantised rows and wkv output, read by its gates ----
      {P::kEngramRows, S::kEngram, m * edim * f},
      {P::kEngramKv, S::kEngram, m * (hc + 1) * dim * f},
      // ---- head: after the last layer (or a DSpark draft's last stage), downloaded before the
      // next pass; the DSpark ring rows issued before the download use only common pieces ----
      {P::kLogits, S::kHead, p.logit_rows * V * f},
  };
  static_assert(sizeof(table) / sizeof(table[0]) == static_cast<size_t>(kScratchPieces), "a piece is missing");
  auto align = [](int64_t b) { return (std::max<int64_t>(b, 1) + kScratchAlign - 1) / kScratchAlign * kScratchAlign; };
  p.pieces.resize(static_cast<size_t>(kScratchPieces));
  std::array<int64_t, kScratchPhases> used{};
  std::array<bool, kScratchPieces> seen{};
  for (const ScratchPlanPiece& t : table) {
    DSV_ASSERT(t.bytes >= 0 && !seen[static_cast<size_t>(t.id)], "scratch piece {}: {} bytes, or listed twice",
               static_cast<int>(t.id), t.bytes);
    seen[static_cast<size_t>(t.id)] = true;
    ScratchPlanPiece& q = p.pieces[static_cast<size_t>(t.id)];
    q = t;
    q.offset = used[static_cast<size_t>(t.phase)];  // within its phase for now
    used[static_cast<size_t>(t.phase)] += align(t.bytes);
    p.unshared += align(t.bytes);
  }
  p.phase_bytes = used;
  // Common pieces first, then the phases, each from the same offset.
  const int64_t common = used[static_cast<size_t>(S::kCommon)];
  int64_t largest = 0;
  for (int k = 1; k < kScratchPhases; ++k) largest = std::max(largest, used[static_cast<size_t>(k)]);
  for (ScratchPlanPiece& q : p.pieces)
    if (q.phase != S::kCommon) q.offset += common;
  p.total = common + largest;
  return p;
}

}  // namespace dsv41::model
