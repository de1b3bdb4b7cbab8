// The start-up budget of the CUDA engine (--device cuda): weights, the state pool and the scratch
// arena are device items; the host-side Engram cache is a device item only where the GPU shares
// system memory. No GPU is needed: the items are arithmetic on the config and the options.
#include <gtest/gtest.h>

#include <algorithm>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/model/cuda_scratch_plan.h"
#include "runtime/serve_startup.h"

using namespace dsv41;
using namespace dsv41::runtime;

namespace {

const std::string kModel = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model";

uint64_t item(const std::vector<BudgetItem>& items, const std::string& name) {
  for (auto& i : items)
    if (i.name == name) return i.bytes;
  ADD_FAILURE() << "no budget item " << name;
  return 0;
}

}  // namespace

TEST(CudaBudget, DeviceItemsFollowTheOptions) {
  const ModelConfig c = load_model_config(kModel + "/config.json");
  ServeMemoryPlan p;
  p.weight_bytes = 10'000'000'000;
  p.world_size = 1;
  p.kv_cache_gib = 3.5;
  p.engram_cache_gib = 0.25;
  const auto discrete = cuda_serve_budget_items(c, p, 256, 128, false);
  EXPECT_EQ(discrete.size(), 6u);  // the same rows as the CPU table
  EXPECT_EQ(item(discrete, budget_item::kWeights), 10'000'000'000u);  // every weight is uploaded
  EXPECT_EQ(item(discrete, budget_item::kSequenceStatePool), uint64_t(3.5 * double(kGiB)));
  EXPECT_EQ(item(discrete, budget_item::kEngramCache), 0u);  // host memory on a discrete GPU
  // the arena and the DSpark drafter's buffers (tiny-s0 has a DSpark stage)
  EXPECT_GT(cuda_dspark_scratch_bytes(c, 256), 0u);
  EXPECT_EQ(item(discrete, budget_item::kWorkspaces), cuda_scratch_bytes(c, 256, 128) + cuda_dspark_scratch_bytes(c, 256));
  const auto host = cuda_host_budget_items(p);
  ASSERT_EQ(host.size(), 1u);
  EXPECT_EQ(item(host, budget_item::kEngramCache), kGiB / 4);
  const auto unified = cuda_serve_budget_items(c, p, 256, 128, true);
  EXPECT_EQ(item(unified, budget_item::kEngramCache), kGiB / 4);
}

// Rank 0 of a tensor-parallel CUDA run: its share of the weights (a 2-rank run of a checkpoint
// larger than one node's memory must pass the check), and the arena of a split MoE layer (one more
// row set of routed rows).
TEST(CudaBudget, TensorParallelRankCountsItsShare) {
  const ModelConfig c = load_model_config(kModel + "/config.json");
  ServeMemoryPlan p;
  p.weight_bytes = 10'000'000'000;
  p.world_size = 2;
  const auto items = cuda_serve_budget_items(c, p, 256, 128, false);
  EXPECT_EQ(item(items, budget_item::kWeights), 5'000'000'000u);
  const uint64_t tp_scratch = cuda_scratch_bytes(c, 256, 128, 256, model::kIndexScoreSliceBytes, true);
  EXPECT_GE(tp_scratch, cuda_scratch_bytes(c, 256, 128));
  EXPECT_EQ(item(items, budget_item::kWorkspaces), tp_scratch + cuda_dspark_scratch_bytes(c, 256));
  p.world_size = 0;
  EXPECT_THROW(cuda_serve_budget_items(c, p, 256, 128, false), Error);
}

// A server's passes are no longer than a step's token budget, so a smaller
// --max-num-batched-tokens shrinks the arena; a DSpark block still fits one pass; tensor-parallel
// ranks keep the default (each reads its own flags, and all must split forwards alike).
TEST(CudaBudget, PassTokensFollowTheStepBudget) {
  ModelConfig c = load_model_config(kModel + "/config.json");
  struct Case {
    int world;
    int64_t budget, dspark_block, want;
  };
  for (const Case& k : {Case{1, 512, 0, 512}, Case{1, 8192, 0, 2048}, Case{1, 4, 16, 16}, Case{1, 4, 0, 4},
                        Case{2, 512, 0, 2048}}) {
    ServeMemoryPlan p;
    p.world_size = k.world;
    p.max_num_batched_tokens = k.budget;
    c.dspark_block_size = k.dspark_block;
    EXPECT_EQ(cuda_serve_pass_tokens(c, p, 2048), k.want)
        << "world " << k.world << " budget " << k.budget << " block " << k.dspark_block;
  }
  // the arena the budget counts follows the pass size
  ServeMemoryPlan p;
  p.max_num_batched_tokens = 256;
  const int64_t small = cuda_serve_pass_tokens(c, p, 2048);
  EXPECT_LT(item(cuda_serve_budget_items(c, p, small, 4096, false), budget_item::kWorkspaces),
            item(cuda_serve_budget_items(c, p, 2048, 4096, false), budget_item::kWorkspaces));
}

TEST(CudaBudget, ScratchCoversLogitsStreamsAndOneScoreSlice) {
  const ModelConfig c = load_model_config(kModel + "/config.json");
  int64_t min_ratio = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.ratio(l) > 0 && (min_ratio == 0 || c.ratio(l) < min_ratio)) min_ratio = c.ratio(l);
  ASSERT_GT(min_ratio, 0);
  for (int64_t m : {1, 64, 256, 1024})
    for (int64_t ctx : {128, 4096, 1 << 20}) {
      // the residual streams of every row, and the larger of the logits of min(m, 256) rows (the
      // head's phase) and the score rows (the attention's phase; the two share memory): all m rows
      // when they fit one slice, else two slices of as many full rows as fit (at least one).
      const int64_t t_max = ctx / min_ratio;
      const int64_t fit = std::max<int64_t>(1, model::kIndexScoreSliceBytes / (t_max * 4));
      const int64_t score_rows = fit >= m ? m : 2 * fit;
      const uint64_t floor = uint64_t(m) * uint64_t(c.hc_mult * c.hidden_size) * 4 +
                             std::max(uint64_t(std::min<int64_t>(m, 256)) * uint64_t(c.vocab_size) * 4,
                                      uint64_t(score_rows) * uint64_t(t_max) * 4);
      EXPECT_GE(cuda_scratch_bytes(c, m, ctx), floor) << m << " " << ctx;
    }
  EXPECT_GT(cuda_scratch_bytes(c, 256, 1 << 20), cuda_scratch_bytes(c, 256, 4096));
  EXPECT_GT(cuda_scratch_bytes(c, 256, 4096), cuda_scratch_bytes(c, 64, 4096));
  EXPECT_THROW(cuda_scratch_bytes(c, 0, 128), Error);
  EXPECT_THROW(cuda_scratch_bytes(c, 64, 128, 256, 0), Error);
}

// The score rows no longer scale with tokens per pass x context: at a long context a larger pass
// adds only its per-token buffers, and the score part is bounded by two slices whatever the pass.
TEST(CudaBudget, ScoreRowsAreSlicedAtLongContexts) {
  const ModelConfig c = load_model_config(kModel + "/config.json");
  const int64_t ctx = int64_t{1} << 22;
  const int64_t short_ctx = 256;  // every pass's score rows fit one slice there
  // Growth with context: the two score slices and what is sized by them (the candidate source's
  // block scores of a slice's rows), the per-row buffers of one score row, and the candidate masks
  // (a bit per block and row), which stop growing at kDeviceCandidateColumns. Unsliced score rows
  // would add m x ctx x 4 bytes.
  const uint64_t mask_blocks =
      uint64_t(model::kDeviceCandidateColumns + c.candidate_block_size - 1) / uint64_t(c.candidate_block_size);
  const uint64_t mask_row_bytes = (mask_blocks + 31) / 32 * 4;
  for (int64_t m : {64, 512, 2048}) {
    const uint64_t grown = cuda_scratch_bytes(c, m, ctx) - cuda_scratch_bytes(c, m, short_ctx);
    EXPECT_LE(grown, uint64_t(4) * uint64_t(model::kIndexScoreSliceBytes) + uint64_t(2) * uint64_t(ctx) * 4 +
                         uint64_t(m) * mask_row_bytes)
        << m;
    // past the cap a context twice as long adds at most score-row-sized buffers
    const int64_t further = static_cast<int64_t>(cuda_scratch_bytes(c, m, 2 * ctx)) -
                            static_cast<int64_t>(cuda_scratch_bytes(c, m, ctx));
    EXPECT_LE(further, 2 * (2 * ctx) * 4) << m;
  }
  // a smaller slice cap shrinks the scratch at a long context (down to two one-row slices)
  EXPECT_LT(cuda_scratch_bytes(c, 512, ctx, 256, 1 << 20), cuda_scratch_bytes(c, 512, ctx));
  EXPECT_EQ(cuda_scratch_bytes(c, 512, ctx, 256, 1), cuda_scratch_bytes(c, 512, ctx, 256, 4));
  // the slicing itself: one buffer of all rows when they fit, else two of as many rows as fit
  const model::IndexScoreSlicing whole = model::index_score_slicing(512, 1000, int64_t{512} * 1000 * 4);
  EXPECT_EQ(whole.buffers, 1);
  EXPECT_EQ(whole.rows, 512);
  const model::IndexScoreSlicing cut = model::index_score_slicing(512, 1000, int64_t{100} * 1000 * 4 + 3);
  EXPECT_EQ(cut.buffers, 2);
  EXPECT_EQ(cut.rows, 100);
  EXPECT_EQ(cut.floats(), 2 * 100 * 1000);
  const model::IndexScoreSlicing one = model::index_score_slicing(512, int64_t{1} << 20, 16);
  EXPECT_EQ(one.rows, 1);
  EXPECT_EQ(one.buffers, 2);
}

#if !DSV41_HAS_CUDA
TEST(CudaBudget, NoCudaInTheBuildMeansNoDevices) {
  std::string why;
  EXPECT_EQ(cuda_device_count(&why), 0);
  EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
  EXPECT_THROW(cuda_device_info(0), Error);
}
#endif

// The DSpark drafter's buffers: at least its fp32 taps, input and pre-mix rows per pass row, linear
// in the rows, none without DSpark stages.
TEST(CudaBudget, DsparkScratchFollowsTheConfig) {
  ModelConfig c = load_model_config(kModel + "/config.json");
  ASSERT_GT(c.num_nextn_predict_layers, 0);
  const uint64_t taps = c.dspark_target_layer_ids.size();
  for (int64_t m : {1, 64, 1024}) {
    const uint64_t floor = uint64_t(m) * (taps + 2) * uint64_t(c.hidden_size) * 4;
    EXPECT_GE(cuda_dspark_scratch_bytes(c, m), floor) << m;
    EXPECT_EQ(cuda_dspark_scratch_bytes(c, 2 * m), 2 * cuda_dspark_scratch_bytes(c, m)) << m;
  }
  EXPECT_THROW(cuda_dspark_scratch_bytes(c, 0), Error);
  c.num_nextn_predict_layers = 0;
  EXPECT_EQ(cuda_dspark_scratch_bytes(c, 1024), 0u);
}

// The bound on the engine's own device memory (beyond weights and state): the released
// config at the default pass size, logit rows and score slices, at the serve default context (the
// config's max_position_embeddings), stays within 2 GiB.
TEST(CudaBudget, ReleasedConfigWorkspacesFitTwoGiB) {
  const ModelConfig c = load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  const model::CudaModelOptions o;
  const uint64_t ws = cuda_scratch_bytes(c, o.max_chunk_tokens, c.max_position_embeddings, o.max_logit_rows,
                                         o.index_score_slice_bytes) +
                      cuda_dspark_scratch_bytes(c, o.max_chunk_tokens);
  EXPECT_LE(ws, 2 * kGiB) << "workspaces " << ws;
  EXPECT_GT(cuda_dspark_scratch_bytes(c, o.max_chunk_tokens), 0u);  // the release has DSpark stages
}
