// Speculative decoding on the CUDA backend (src/spec/cuda_backend.cpp), the GPU counterpart of
// tests/spec/spec_greedy_test.cpp: greedy generation with speculation equals the engine's own
// one-token decode loop, token for token, on tiny-s0 and tiny-long for k = 1..4 (the model's own
// drafter: every draft rejected; a scripted drafter: full and partial acceptance), a batch of 8
// concurrent sequences with mixed settings equals their solo runs, step undo restores a state
// exactly, and `generate --device cuda` prints the same tokens with and without speculation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../spec/spec_fixture.h"
#include "../spec/spec_run.h"
#include "../support/run_cli.h"
#include "dsv41/common/error.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/spec/cuda_backend.h"

using namespace dsv41;
using test_support::collect_ids;
using test_support::generate;
using test_support::Generated;
using test_support::greedy;
using test_support::spec_options;
using test_support::sum;

namespace {

std::unique_ptr<model::CudaModel> load_cuda(const std::string& fixture, int64_t mix_parts = 0) {
  model::CudaModelOptions o;
  o.engram_token_map = test_support::fixture_dir(fixture) + "/engram_token_map.safetensors";
  o.mix_gemm_k_parts = mix_parts;
  o.grouped_moe_min_rows = 0;  // exact MoE kernels: batched drafts must equal solo ones bit for bit
  return model::CudaModel::load(test_support::fixture_dir(fixture) + "/model", o);
}

void check_fixture(const std::string& fixture, int64_t n, int64_t mix_parts, bool compare_golden) {
  auto m = load_cuda(fixture, mix_parts);
  ASSERT_TRUE(m->has_dspark());
  const auto prompt = test_support::golden_ids(fixture, "prompt_ids");
  const auto ref = test_support::engine_greedy(*m, prompt, n);
  if (compare_golden) {
    const auto golden = test_support::golden_ids(fixture, "greedy_ids");
    ASSERT_EQ(std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(golden.size())), golden);
  }
  sched::SchedulerOptions off = spec_options(0, false);
  off.spec.method = spec::SpecMethod::none;
  EXPECT_EQ(generate(*m, nullptr, off, greedy(prompt, n)).ids, ref) << fixture << " without speculation";

  // The model's own drafter (random weights, never right): every step rolls back to the anchor.
  auto own = spec::make_cuda_spec_backend(*m);
  for (int64_t k = 1; k <= 4; ++k) {
    spec::SpecStats st;
    const Generated g = generate(*m, own.get(), spec_options(k, false), greedy(prompt, n), &st);
    EXPECT_EQ(g.ids, ref) << fixture << " own drafter, k = " << k;
    EXPECT_EQ(sum(g.accepted), n);
    EXPECT_GT(st.verify_steps, 0) << "k = " << k;
  }
  EXPECT_GT(own->last_draft_seconds(), 0.0);
  EXPECT_GT(own->last_forward_seconds(), 0.0);

  // Drafts that know the answer except at every third position: full acceptance with a bonus
  // token, rollback in the middle of a verify, and rejection all occur.
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), ref.begin(), ref.end());
  const int64_t S = static_cast<int64_t>(prompt.size());
  test_support::ScriptedDrafter scripted(spec::make_cuda_spec_backend(*m), m->config().vocab_size, {{S, full}},
                                         [](int64_t, int64_t pos) { return pos % 3 == 0; });
  for (int64_t k = 1; k <= 4; ++k) {
    spec::SpecStats st;
    const Generated g = generate(*m, &scripted, spec_options(k, false), greedy(prompt, n), &st);
    EXPECT_EQ(g.ids, ref) << fixture << " scripted drafter, k = " << k;
    EXPECT_EQ(sum(g.accepted), n);
    EXPECT_GT(st.accepted_tokens, 0) << "k = " << k;
    if (k >= 2 && m->config().dspark_block_size >= 2) {
      EXPECT_LT(static_cast<int64_t>(g.accepted.size()), n) << "speculation saved no target step";
      EXPECT_GT(*std::max_element(g.accepted.begin(), g.accepted.end()), 2);  // a full acceptance + bonus
    }
  }
  EXPECT_EQ(generate(*m, &scripted, spec_options(4, true), greedy(prompt, n)).ids, ref) << "adaptive k";
}

}  // namespace

TEST(GpuSpec, TinyS0GreedyEqualsNonSpeculative) { check_fixture("tiny-s0", 24, 0, true); }

TEST(GpuSpec, TinyLongGreedyEqualsNonSpeculative) { check_fixture("tiny-long", 12, 3, false); }

// Steps saved before positions p, p+1, .. and undone in reverse leave a state that continues
// exactly as one that never took them: at both parities of the ratio-2 compressor, inside and
// beyond the window, also across a wrap of the ring slots.
TEST(GpuSpec, UndoRestoresEveryPieceOfState) {
  auto m = load_cuda("tiny-s0");
  const auto prompt = test_support::golden_ids("tiny-s0", "prompt_ids");
  const int64_t V = m->config().vocab_size;
  for (size_t len : {size_t{6}, size_t{7}, size_t{40}, size_t{41}}) {
    const std::vector<int32_t> p(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(len));
    auto clean = m->new_sequence();
    auto detour = m->new_sequence();
    clean->prompt_len = detour->prompt_len = static_cast<int64_t>(len);
    std::vector<float> lc, ld;
    m->forward_sequence(*clean, p, false, &lc);
    m->forward_sequence(*detour, p, false, &ld);
    // Four wrong tokens, each step saved, then all undone.
    std::vector<model::CudaStepUndo> saved(4);
    for (int i = 0; i < 4; ++i) {
      m->save_step(*detour, saved[static_cast<size_t>(i)]);
      const int32_t wrong = static_cast<int32_t>((7 * i + 3) % V);
      m->forward_sequence(*detour, std::span<const int32_t>(&wrong, 1), false, &ld);
    }
    for (int i = 3; i >= 0; --i) m->undo_step(*detour, saved[static_cast<size_t>(i)]);
    EXPECT_EQ(detour->n_past, clean->n_past);
    // Both continue greedily; logits and drafts must be bit-identical.
    int32_t tok = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    for (int step = 0; step < 6; ++step) {
      const model::DsparkDraft dc = m->dspark_draft(*clean, tok), dd = m->dspark_draft(*detour, tok);
      EXPECT_EQ(dd.logits, dc.logits) << "prompt " << len << " step " << step << ": DSpark rings differ";
      m->forward_sequence(*clean, std::span<const int32_t>(&tok, 1), false, &lc);
      m->forward_sequence(*detour, std::span<const int32_t>(&tok, 1), false, &ld);
      ASSERT_EQ(ld, lc) << "prompt " << len << " step " << step;
      tok = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    }
  }
  // A save of one sequence cannot undo another.
  auto a = m->new_sequence(), b = m->new_sequence();
  m->forward_sequence(*a, std::span<const int32_t>(prompt.data(), 3), false, nullptr);
  m->forward_sequence(*b, std::span<const int32_t>(prompt.data(), 3), false, nullptr);
  model::CudaStepUndo u;
  m->save_step(*a, u);
  EXPECT_THROW(m->undo_step(*b, u), Error);
}

// Eight sequences in one scheduler on the GPU: speculation off, server default, k = 1..4,
// different acceptance (the scripted drafter errs at different rates per sequence), one seeded
// sampled request. Every greedy sequence equals its own engine reference; the sampled one equals
// the same request run alone.
TEST(GpuSpec, BatchOfEightWithMixedSettings) {
  auto m = load_cuda("tiny-s0");
  const auto base = test_support::golden_ids("tiny-s0", "prompt_ids");
  const int64_t n = 20;
  const std::vector<int64_t> spec_tokens = {0, -1, 1, 2, 3, 4, 2, 1};
  std::vector<std::vector<int32_t>> prompts, refs;
  test_support::ScriptedDrafter::Truth truth;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p(base.begin() + i * 3, base.end() - i * 2);  // distinct lengths tell them apart
    prompts.push_back(p);
    refs.push_back(test_support::engine_greedy(*m, p, n));
    std::vector<int32_t> full = p;
    full.insert(full.end(), refs.back().begin(), refs.back().end());
    truth[static_cast<int64_t>(p.size())] = full;
  }
  std::map<int64_t, int> index_of;
  for (int i = 0; i < 8; ++i) index_of[static_cast<int64_t>(prompts[static_cast<size_t>(i)].size())] = i;
  test_support::ScriptedDrafter scripted(spec::make_cuda_spec_backend(*m), m->config().vocab_size, truth,
                                         [index_of](int64_t len, int64_t pos) {
                                           const auto it = index_of.find(len);
                                           const int i = it == index_of.end() ? 0 : it->second;
                                           return (pos * (i + 2)) % (i + 3) == 0;
                                         });
  auto sampled_request = [&] {
    sched::GenerationRequest r = greedy(prompts[6], n, 2);
    r.sampling.temperature = 0.9;
    r.sampling.top_k = 30;
    r.sampling.has_seed = true;
    r.sampling.seed = 77;
    return r;
  };
  const auto so = spec_options(4, true);
  const Generated alone = generate(*m, &scripted, so, sampled_request());

  sched::Scheduler s(*m, so, &scripted);
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < 8; ++i)
    chans.push_back(s.submit(i == 6 ? sampled_request()
                                    : greedy(prompts[static_cast<size_t>(i)], n, spec_tokens[static_cast<size_t>(i)])));
  s.start();
  for (int i = 0; i < 8; ++i) {
    const auto ids = collect_ids(*chans[static_cast<size_t>(i)]);
    if (i == 6) EXPECT_EQ(ids, alone.ids) << "seeded sampled request changed by batching";
    else EXPECT_EQ(ids, refs[static_cast<size_t>(i)]) << "sequence " << i << " (spec_tokens " << spec_tokens[static_cast<size_t>(i)] << ")";
  }
  const auto st = s.stats();
  EXPECT_GT(st.spec.verify_steps, 0);
  EXPECT_GT(st.spec.accepted_tokens, 0);
  EXPECT_LT(st.spec.accepted_tokens, st.spec.draft_tokens);
  s.stop();
  EXPECT_EQ(s.stats().pool_used_bytes, 0);
}

// The command line: same ids with --spec-method dspark (k = 1 and 2) and none, equal to the
// fixture's greedy ids; `accepted` sums to the generated count.
TEST(GpuSpec, GenerateCliOnCuda) {
  const std::string dir = test_support::fixture_dir("tiny-s0");
  const auto prompt = test_support::golden_ids("tiny-s0", "prompt_ids");
  const auto golden = test_support::golden_ids("tiny-s0", "greedy_ids");
  const std::string ids = std::string(::testing::TempDir()) + "/dsv41_gpu_spec_prompt_" + std::to_string(::getpid()) + ".json";
  std::ofstream(ids) << nlohmann::json(prompt).dump();
  const int64_t n = static_cast<int64_t>(golden.size());
  std::vector<std::vector<int32_t>> outs;
  for (const std::string spec : {"--spec-method none", "--spec-method dspark --spec-tokens 1",
                                 "--spec-method dspark --spec-tokens 2"}) {
    const auto r = test::run_cli("generate --device cuda --model " + dir + "/model --engram-token-map " + dir +
                                     "/engram_token_map.safetensors --prompt-ids " + ids + " --max-tokens " +
                                     std::to_string(n) + " " + spec,
                                 test::Stderr::kDiscard);
    ASSERT_EQ(r.exit_code, 0) << spec << "\n" << r.out;
    const auto j = nlohmann::json::parse(r.out);
    outs.push_back(j["ids"].get<std::vector<int32_t>>());
    int64_t total = 0;
    for (int64_t a : j["accepted"].get<std::vector<int64_t>>()) total += a;
    EXPECT_EQ(total, static_cast<int64_t>(outs.back().size())) << spec;
    EXPECT_EQ(j["steps"].get<int64_t>(), static_cast<int64_t>(j["accepted"].size())) << spec;
  }
  EXPECT_EQ(outs[0], golden);
  EXPECT_EQ(outs[1], outs[0]);
  EXPECT_EQ(outs[2], outs[0]);
}
