// Index scores in row slices (CudaModelOptions::index_score_slice_bytes, Impl::index_score_slices):
// a pass's rows are scored, downloaded and selected a slice at a time, two buffers alternating.
// Each row's scores and selection depend on that row alone, so any slice size must give logits
// bit-identical to one slice per pass, in prefill passes (several slices per pass, an uneven last
// one, the candidate source layer's masks carried to later layers) and in batched decode steps
// (row groups); and the CPU engine must still agree (cpu_parity_test.cpp's rule). The scratch then
// shrinks, and the start-up estimate (cuda_scratch_bytes) still covers the real arena.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "model_check.h"
#include "runtime/serve_startup.h"

using namespace dsv41;

namespace {

const std::string kFixtures = DSV41_FIXTURES_DIR;
constexpr double kRelTol = 1e-3;  // cpu_parity_test.cpp

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

model::CudaModelOptions opts(const std::string& fixture, int64_t context, int64_t pass_tokens, int64_t slice_bytes) {
  model::CudaModelOptions o;
  o.engram_token_map = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
  o.max_context = context;
  o.max_chunk_tokens = pass_tokens;
  o.index_score_slice_bytes = slice_bytes;
  o.exact_block_sums = true;  // sequential block sums, no grouped MoE: compared with the CPU engine bit for bit
  o.dspark = false;
  return o;
}

// Score columns of the widest row: context / smallest compress ratio (alloc_scratch's t_max).
int64_t score_columns(const ModelConfig& c, int64_t context) {
  int64_t min_ratio = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.ratio(l) > 0 && (min_ratio == 0 || c.ratio(l) < min_ratio)) min_ratio = c.ratio(l);
  return min_ratio > 0 ? std::max<int64_t>(1, context / min_ratio) : 1;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

}  // namespace

// tiny-long (chaotic: a 1-ulp change flips top-k selections): prompt one-shot and in chunks of 64,
// passes of 48 rows, slices of one row and of three full rows against one slice per pass.
TEST(GpuScoreSlices, PrefillSlicesMatchOneSliceAndCpu) {
  const std::string dir = kFixtures + "/tiny-long";
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  const TensorInfo& p = *golden->find("prompt_ids");
  std::vector<int32_t> prompt(static_cast<size_t>(p.numel()));
  std::memcpy(prompt.data(), p.data, prompt.size() * 4);
  const int64_t decode = 12, context = static_cast<int64_t>(prompt.size()) + decode, pass = 48;

  model::CpuModelOptions co;
  co.engram_token_map = dir + "/engram_token_map.safetensors";
  co.dspark = false;
  auto cpu = model::CpuModel::load(dir + "/model", co);
  const ModelConfig& c = cpu->config();
  const int64_t V = c.vocab_size, t_max = score_columns(c, context);
  ASSERT_GT(pass * t_max * 4, 3 * t_max * 4 + 4) << "the slice sizes below must cut a pass";

  auto whole = model::CudaModel::load(dir + "/model", opts("tiny-long", context, pass, model::kIndexScoreSliceBytes));
  auto one_row = model::CudaModel::load(dir + "/model", opts("tiny-long", context, pass, 1));
  auto three_rows = model::CudaModel::load(dir + "/model", opts("tiny-long", context, pass, 3 * t_max * 4 + 4));
  // the sliced arenas hold two slices instead of every row's scores
  EXPECT_LT(one_row->memory().scratch, whole->memory().scratch);
  EXPECT_LT(one_row->memory().pinned_host, whole->memory().pinned_host);
  EXPECT_LT(three_rows->memory().scratch, whole->memory().scratch);

  for (int64_t chunk : {int64_t{0}, int64_t{64}}) {
    const std::string what = "tiny-long chunk " + std::to_string(chunk);
    const test::Run want = test::run_steps(*whole, prompt, chunk, decode);
    const test::Run a = test::run_steps(*one_row, prompt, chunk, decode);
    const test::Run b = test::run_steps(*three_rows, prompt, chunk, decode);
    EXPECT_TRUE(bits_equal(a.prefill, want.prefill)) << what << ": one-row slices, prefill";
    EXPECT_TRUE(bits_equal(a.decode, want.decode)) << what << ": one-row slices, decode";
    EXPECT_EQ(a.greedy, want.greedy) << what;
    EXPECT_TRUE(bits_equal(b.prefill, want.prefill)) << what << ": three-row slices, prefill";
    EXPECT_TRUE(bits_equal(b.decode, want.decode)) << what << ": three-row slices, decode";
    EXPECT_EQ(b.greedy, want.greedy) << what;
    const test::Run ref = test::run_steps(*cpu, prompt, chunk, decode);
    EXPECT_EQ(test::argmax_mismatches(a.prefill, ref.prefill, V), 0) << what << ": prefill argmax vs cpu";
    EXPECT_LE(test::worst_rel(a.prefill, ref.prefill, V), kRelTol) << what << ": prefill logits vs cpu";
    EXPECT_EQ(a.greedy, ref.greedy) << what << ": greedy ids vs cpu";
    if (a.greedy == ref.greedy) EXPECT_LE(test::worst_rel(a.decode, ref.decode, V), kRelTol) << what;
    std::cout << what << ": sliced vs cpu bit-identical fraction " << test::identical_fraction(a.prefill, ref.prefill)
              << " (prefill), " << test::identical_fraction(a.decode, ref.decode) << " (decode)\n";
  }
}

// Batched decode steps whose rows' score columns exceed one slice run as row groups: every
// sequence's logits equal its steps alone on an unsliced model, bit for bit.
TEST(GpuScoreSlices, BatchedDecodeGroupsMatchStepsAlone) {
  const std::string fixture = "tiny-s0", dir = kFixtures + "/" + fixture + "/model";
  const int64_t context = 128, steps = 10;
  auto whole = model::CudaModel::load(dir, opts(fixture, context, 64, model::kIndexScoreSliceBytes));
  const ModelConfig& c = whole->config();
  const int64_t V = c.vocab_size;
  // one slice holds one full row's scores: the batch of five splits into groups of rows
  auto sliced = model::CudaModel::load(dir, opts(fixture, context, 64, score_columns(c, context) * 4));
  const std::vector<int64_t> prompt_lens = {9, 40, 23, 70, 55};
  const size_t S = prompt_lens.size();
  std::vector<std::unique_ptr<SeqState>> together(S), alone(S);
  std::vector<std::vector<float>> got(S), want(S);
  for (size_t i = 0; i < S; ++i) {
    const std::vector<int32_t> prompt = random_ids(prompt_lens[i], V, 31 + static_cast<uint32_t>(i));
    together[i] = sliced->new_sequence();
    alone[i] = whole->new_sequence();
    together[i]->prompt_len = alone[i]->prompt_len = prompt_lens[i];
    std::vector<float> lg;
    sliced->forward_sequence(*together[i], prompt, false, &lg);
    got[i] = lg;
    whole->forward_sequence(*alone[i], prompt, false, &lg);
    want[i] = lg;
  }
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<int32_t> feed = random_ids(static_cast<int64_t>(S), V, 500 + static_cast<uint32_t>(s));
    std::vector<ForwardItem> items(S);
    std::vector<std::vector<float>> out(S);
    for (size_t i = 0; i < S; ++i) {
      items[i].tokens = std::span<const int32_t>(&feed[i], 1);
      items[i].state = together[i].get();
      items[i].logits = &out[i];
    }
    sliced->forward(items);
    for (size_t i = 0; i < S; ++i) {
      got[i].insert(got[i].end(), out[i].begin(), out[i].end());
      std::vector<float> lg;
      whole->forward_sequence(*alone[i], std::span<const int32_t>(&feed[i], 1), false, &lg);
      want[i].insert(want[i].end(), lg.begin(), lg.end());
    }
  }
  for (size_t i = 0; i < S; ++i)
    EXPECT_TRUE(bits_equal(got[i], want[i])) << "sequence " << i << " (bit-identical fraction "
                                             << test::identical_fraction(got[i], want[i]) << ")";
}

// The start-up budget's scratch estimate is the arena the model allocates (the same layout,
// dsv41/model/cuda_scratch_plan.h), with and without slicing.
TEST(GpuScoreSlices, ScratchEstimateIsTheArena) {
  const std::string fixture = "tiny-s0", dir = kFixtures + "/" + fixture + "/model";
  struct Case {
    int64_t context, pass, slice_bytes;
  } cases[] = {{128, 64, model::kIndexScoreSliceBytes}, {128, 64, 1}, {100, 256, 2000}, {128, 7, 1 << 20}};
  for (const Case& k : cases) {
    auto m = model::CudaModel::load(dir, opts(fixture, k.context, k.pass, k.slice_bytes));
    const uint64_t estimate = runtime::cuda_scratch_bytes(m->config(), k.pass, k.context, 256, k.slice_bytes);
    const auto arena = static_cast<uint64_t>(m->memory().scratch);
    EXPECT_EQ(estimate, arena) << "context " << k.context << " pass " << k.pass << " slice " << k.slice_bytes;
    std::cout << "context " << k.context << " pass " << k.pass << " slice " << k.slice_bytes << ": arena " << arena
              << " bytes, estimate " << estimate << "\n";
  }
}
