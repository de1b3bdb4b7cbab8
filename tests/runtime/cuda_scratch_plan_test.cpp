// The CUDA scratch arena's layout (dsv41/model/cuda_scratch_plan.h): buffers of one phase never
// overlap each other or a common buffer, the phases share one region after the common buffers, and
// the start-up estimate is the arena's size. No GPU: the plan is arithmetic on the config.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/model/cuda_scratch_plan.h"
#include "runtime/serve_startup.h"

using namespace dsv41;
using namespace dsv41::model;

namespace {

const std::string kTiny = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model/config.json";
const std::string kReleased = std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json";

ScratchPlan plan(const ModelConfig& c, int64_t m, int64_t ctx, bool tp = false) {
  ScratchPlanInputs in;
  in.tokens = m;
  in.max_context = ctx;
  in.tensor_parallel = tp;
  return plan_cuda_scratch(c, in);
}

bool overlap(const ScratchPlanPiece& a, const ScratchPlanPiece& b) {
  const int64_t ea = a.offset + std::max<int64_t>(a.bytes, 1), eb = b.offset + std::max<int64_t>(b.bytes, 1);
  return a.offset < eb && b.offset < ea;
}

// Every piece inside the arena and aligned; two pieces overlap only when they belong to two
// different non-common phases; the region after the common pieces is the largest phase.
void check_layout(const ScratchPlan& p, const std::string& what) {
  ASSERT_EQ(p.pieces.size(), static_cast<size_t>(kScratchPieces)) << what;
  const int64_t common = p.phase_bytes[static_cast<size_t>(ScratchPhase::kCommon)];
  int64_t largest = 0;
  for (int k = 1; k < kScratchPhases; ++k) largest = std::max(largest, p.phase_bytes[static_cast<size_t>(k)]);
  EXPECT_EQ(p.total, common + largest) << what;
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const ScratchPlanPiece& a = p.pieces[i];
    EXPECT_EQ(static_cast<size_t>(a.id), i) << what;
    EXPECT_EQ(a.offset % kScratchAlign, 0) << what << " piece " << i;
    EXPECT_LE(a.offset + a.bytes, p.total) << what << " piece " << i;
    if (a.phase == ScratchPhase::kCommon) EXPECT_LT(a.offset, common) << what << " piece " << i;
    else EXPECT_GE(a.offset, common) << what << " piece " << i;
    for (size_t j = i + 1; j < p.pieces.size(); ++j) {
      const ScratchPlanPiece& b = p.pieces[j];
      const bool may_share = a.phase != b.phase && a.phase != ScratchPhase::kCommon && b.phase != ScratchPhase::kCommon;
      if (!may_share) EXPECT_FALSE(overlap(a, b)) << what << " pieces " << i << " and " << j;
    }
  }
}

}  // namespace

TEST(CudaScratchPlan, PhasesShareOneRegionAndNothingElse) {
  for (const std::string& path : {kTiny, kReleased}) {
    const ModelConfig c = load_model_config(path);
    for (int64_t m : {1, 7, 256, 1024, 2048})
      for (int64_t ctx : {int64_t{128}, int64_t{8192}, int64_t{1} << 20})
        for (bool tp : {false, true}) {
          const ScratchPlan p = plan(c, m, ctx, tp);
          check_layout(p, path + " m " + std::to_string(m) + " ctx " + std::to_string(ctx) + (tp ? " tp" : ""));
          EXPECT_LT(p.total, p.unshared) << m << " " << ctx;  // the phases do share
        }
  }
}

// The pieces that must outlive a phase stay common (changing one of these tags would let a later
// phase overwrite what an earlier one left for it: e.g. the top-k, which the layers below an index
// source attend to); the large per-sublayer buffers are shared.
TEST(CudaScratchPlan, PhaseOfEachKindOfBuffer) {
  const ScratchPlan p = plan(load_model_config(kReleased), 1024, 8192);
  for (ScratchPiece id : {ScratchPiece::kH, ScratchPiece::kPre, ScratchPiece::kX, ScratchPiece::kY, ScratchPiece::kMixA,
                          ScratchPiece::kCodes, ScratchPiece::kXCodes, ScratchPiece::kSlots, ScratchPiece::kEngramRaw,
                          ScratchPiece::kPositions, ScratchPiece::kMixCounters, ScratchPiece::kBatchPools,
                          ScratchPiece::kTopk, ScratchPiece::kCandKeep, ScratchPiece::kRows16})
    EXPECT_EQ(p.at(id).phase, ScratchPhase::kCommon) << static_cast<int>(id);
  for (ScratchPiece id : {ScratchPiece::kQ, ScratchPiece::kO, ScratchPiece::kScores, ScratchPiece::kScoreIdx,
                          ScratchPiece::kBlockScores, ScratchPiece::kBlockIdx, ScratchPiece::kBlockSel, ScratchPiece::kList})
    EXPECT_EQ(p.at(id).phase, ScratchPhase::kAttention) << static_cast<int>(id);
  for (ScratchPiece id : {ScratchPiece::kEg, ScratchPiece::kEu, ScratchPiece::kRouted, ScratchPiece::kIds, ScratchPiece::kShared})
    EXPECT_EQ(p.at(id).phase, ScratchPhase::kMoe) << static_cast<int>(id);
  EXPECT_EQ(p.at(ScratchPiece::kEngramKv).phase, ScratchPhase::kEngram);
  EXPECT_EQ(p.at(ScratchPiece::kLogits).phase, ScratchPhase::kHead);
  // the first attention piece (qr) and the first MoE piece (ids) both start the shared region
  EXPECT_EQ(p.at(ScratchPiece::kQr).offset, p.at(ScratchPiece::kIds).offset);
}

// The buffers keep the sizes the kernels index them with: a split MoE's routed rows hold one more
// row set (the shared expert's rows after them, cuda_tp.cpp), sg holds sg and su.
TEST(CudaScratchPlan, PieceSizes) {
  const ModelConfig c = load_model_config(kReleased);
  const int64_t m = 512, K = std::max(c.num_experts_per_tok, c.dspark_topk());
  const ScratchPlan one = plan(c, m, 8192), two = plan(c, m, 8192, true);
  EXPECT_EQ(one.at(ScratchPiece::kRouted).bytes, m * K * c.hidden_size * 4);
  EXPECT_EQ(two.at(ScratchPiece::kRouted).bytes, m * (K + 1) * c.hidden_size * 4);
  EXPECT_EQ(one.at(ScratchPiece::kSg).bytes, 2 * m * c.moe_intermediate_size * 4);
  EXPECT_EQ(one.at(ScratchPiece::kQ).bytes, m * c.num_attention_heads * c.head_dim * 4);
  EXPECT_EQ(one.at(ScratchPiece::kLogits).bytes, 256 * c.vocab_size * 4);
  EXPECT_EQ(one.at(ScratchPiece::kScores).bytes, one.slicing.floats() * 4);
  EXPECT_EQ(one.at(ScratchPiece::kScoreIdx).bytes, one.slicing.slice_floats() * 2);  // uint16 per score of a slice
  // candidate masks on the device: blocks of the context's widest source row, up to 131,072 columns
  EXPECT_EQ(one.cand_blocks, (8192 + c.candidate_block_size - 1) / c.candidate_block_size);
  EXPECT_EQ(one.at(ScratchPiece::kCandKeep).bytes, m * ((one.cand_blocks + 31) / 32) * 4);  // a bit per block
  const ScratchPlan far = plan(c, m, int64_t{1} << 22);
  EXPECT_EQ(far.cand_blocks, (model::kDeviceCandidateColumns + c.candidate_block_size - 1) / c.candidate_block_size);
  EXPECT_EQ(far.at(ScratchPiece::kCandKeep).bytes, m * ((far.cand_blocks + 31) / 32) * 4);
  EXPECT_EQ(one.at(ScratchPiece::kBlockSel).bytes, one.cand_rows * std::min(c.candidate_topk_blocks, one.cand_blocks) * 4);
  EXPECT_THROW(plan(c, 0, 8192), Error);
  // An EXL3 checkpoint's large passes sort the pairs' rows by expert (cuda_exl3.cpp): their fp16
  // inputs of the gate and up projections ([2][pairs][dim], dim a multiple of 128 here) and the
  // index in the MoE phase; none for the FP8 release.
  EXPECT_EQ(one.at(ScratchPiece::kExl3Rows).bytes, 0);
  ModelConfig x = c;
  x.quant.method = "exl3";
  const ScratchPlan ex = plan(x, m, 8192);
  const Exl3SortLayout sl = exl3_sort_layout(m * K, c.hidden_size, c.moe_intermediate_size, c.n_routed_experts);
  EXPECT_EQ(sl.xh_bytes, (2 * m * K * c.hidden_size * 2 + 255) / 256 * 256);
  EXPECT_EQ(ex.at(ScratchPiece::kExl3Rows).bytes, sl.xh_bytes + (4 * m * K + 4 * sl.max_tiles) * 4);
  EXPECT_EQ(ex.at(ScratchPiece::kExl3Rows).phase, ScratchPhase::kMoe);
  check_layout(ex, "exl3");
  // The Lin8 GEMM's f16 rows (Lin8Args::rows16): m rows of the widest Lin8 input of a layer (wo_b's
  // o_groups x o_lora_rank = 8192 in the release), 2 bytes a value, then a row exponent each; none
  // for an EXL3 checkpoint, which has no Lin8 linears.
  const int64_t widest = std::max({c.hidden_size, c.q_lora_rank, c.o_groups * c.o_lora_rank, c.moe_intermediate_size,
                                   c.n_engram_columns() * c.engram_head_dim});
  EXPECT_EQ(widest, 8192);
  EXPECT_EQ(one.rows16_in, widest);
  EXPECT_EQ(one.at(ScratchPiece::kRows16).bytes, (m * widest * 2 + 15) / 16 * 16 + m * 4);
  EXPECT_EQ(ex.at(ScratchPiece::kRows16).bytes, 0);
  // At 2048-token passes the MoE phase stays below the attention phase, so the arena is as large.
  const ScratchPlan ex2048 = plan(x, 2048, 1 << 20), fp2048 = plan(c, 2048, 1 << 20);
  EXPECT_LE(ex2048.total, fp2048.total + fp2048.total / 50) << ex2048.total << " vs " << fp2048.total;
}

// The EXL3 MoE's tile bound holds for any split of a layer's pairs among its experts: the grouped
// GEMMs take ceil(rows / 64) tiles an expert in each of three projections (cuda_exl3.cpp).
TEST(CudaScratchPlan, Exl3TileBoundCoversEveryRouting) {
  std::mt19937_64 rng(5);
  for (int64_t experts : {4, 16, 384}) {
    for (int64_t pairs : {1, 63, 64, 65, 777, 12288}) {
      std::vector<std::vector<int64_t>> splits;
      splits.push_back({pairs});  // everything on one expert
      std::vector<int64_t> ones(static_cast<size_t>(std::min(pairs, experts)), 1);  // one row each, rest on one
      ones[0] += pairs - static_cast<int64_t>(ones.size());
      splits.push_back(ones);
      std::vector<int64_t> spill;  // 65 rows an expert (two tiles each) while rows last
      for (int64_t left = pairs; left > 0 && static_cast<int64_t>(spill.size()) < experts; left -= 65)
        spill.push_back(std::min<int64_t>(65, left));
      spill[0] += pairs - std::accumulate(spill.begin(), spill.end(), int64_t{0});
      splits.push_back(spill);
      std::vector<int64_t> random(static_cast<size_t>(experts), 0);
      for (int64_t p = 0; p < pairs; ++p) ++random[rng() % static_cast<uint64_t>(experts)];
      splits.push_back(random);
      const Exl3SortLayout l = exl3_sort_layout(pairs, 5120, 2304, experts);
      for (const auto& rows : splits) {
        int64_t tiles = 0;
        for (int64_t c : rows) tiles += 3 * ((c + 63) / 64);
        EXPECT_LE(tiles, l.max_tiles) << pairs << " pairs over " << experts << " experts";
      }
    }
  }
}

// The start-up estimate is the plan's arena, and the serve budget takes a rank's arena under
// tensor parallelism.
TEST(CudaScratchPlan, EstimateIsTheArena) {
  const ModelConfig c = load_model_config(kReleased);
  for (int64_t m : {64, 1024, 2048}) {
    EXPECT_EQ(runtime::cuda_scratch_bytes(c, m, 1 << 20), static_cast<uint64_t>(plan(c, m, 1 << 20).total)) << m;
    EXPECT_EQ(runtime::cuda_scratch_bytes(c, m, 1 << 20, 256, kIndexScoreSliceBytes, true),
              static_cast<uint64_t>(plan(c, m, 1 << 20, true).total))
        << m;
  }
  runtime::ServeMemoryPlan sp;
  sp.world_size = 2;
  int found = 0;
  for (const runtime::BudgetItem& i : runtime::cuda_serve_budget_items(c, sp, 2048, 1 << 20, false))
    if (i.name == runtime::budget_item::kWorkspaces) {
      ++found;
      EXPECT_EQ(i.bytes, runtime::cuda_scratch_bytes(c, 2048, 1 << 20, 256, kIndexScoreSliceBytes, true) +
                             runtime::cuda_dspark_scratch_bytes(c, 2048));
    }
  EXPECT_EQ(found, 1);
}

// The 2 GiB engine overhead at the serve default context (1M) holds for 2048-token passes
// with the DSpark drafter's buffers (the reason the pass size could double).
TEST(CudaScratchPlan, ReleasedConfigFitsTwoGiBWith2048TokenPasses) {
  const ModelConfig c = load_model_config(kReleased);
  const uint64_t ws = runtime::cuda_scratch_bytes(c, 2048, c.max_position_embeddings) +
                      runtime::cuda_dspark_scratch_bytes(c, 2048);
  EXPECT_LE(ws, 2 * runtime::kGiB) << ws;
}
