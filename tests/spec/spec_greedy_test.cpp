// Greedy generation with speculative decoding equals generation without it, token for token, on
// the tiny fixture models: alone with k = 1..4, with the model's own drafter (every draft
// rejected: rollback to the anchor) and with a scripted drafter (full and partial acceptance),
// and in a batch of 8 concurrent sequences with mixed settings. The reference is the engine's own
// one-token decode loop (and on tiny-s0 the fixture's greedy_ids).
#include <gtest/gtest.h>

#include <chrono>

#include "spec_fixture.h"
#include "spec_run.h"

using namespace dsv41;
using test_support::collect_ids;
using test_support::generate;
using test_support::Generated;
using test_support::greedy;
using test_support::spec_options;
using test_support::sum;

namespace {

// `all_variants` false (tiny-long, whose 300-token prefill dominates): the scripted drafter with
// k = 1..4 and the own drafter with k = 4 only.
void check_fixture(const std::string& fixture, int64_t n, bool compare_golden, bool all_variants) {
  auto m = test_support::load_tiny(fixture);
  const auto prompt = test_support::golden_ids(fixture, "prompt_ids");
  const auto ref = test_support::engine_greedy(*m, prompt, n);
  if (compare_golden) {
    const auto golden = test_support::golden_ids(fixture, "greedy_ids");
    ASSERT_EQ(std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(golden.size())), golden);
  }
  // Without speculation, through the scheduler.
  if (all_variants) {
    sched::SchedulerOptions off = spec_options(0, false);
    off.spec.method = spec::SpecMethod::none;
    EXPECT_EQ(generate(*m, nullptr, off, greedy(prompt, n)).ids, ref);
  }

  // The model's own drafter: on random weights it is never right, so every step rolls back to the
  // anchor alone (k positions discarded) and commits the target's token.
  auto own = spec::make_cpu_spec_backend(*m);
  for (int64_t k : all_variants ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{4}) {
    spec::SpecStats st;
    const Generated g = generate(*m, own.get(), spec_options(k, false), greedy(prompt, n), &st);
    EXPECT_EQ(g.ids, ref) << fixture << " own drafter, k = " << k;
    EXPECT_EQ(sum(g.accepted), n);
    EXPECT_GT(st.verify_steps, 0) << "k = " << k;
    // Full-length drafts except where max_tokens leaves less room (the last steps).
    const int64_t kk = std::min<int64_t>(k, m->config().dspark_block_size);
    EXPECT_LE(st.draft_tokens, st.verify_steps * kk);
    EXPECT_GE(st.draft_tokens, (st.verify_steps - 1) * kk + 1);
  }

  // A drafter that knows the answer except at every third position: steps accept everything
  // (bonus token), part of the drafts (rollback in the middle) or nothing.
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), ref.begin(), ref.end());
  const int64_t S = static_cast<int64_t>(prompt.size());
  test_support::ScriptedDrafter scripted(*m, {{S, full}}, [](int64_t, int64_t pos) { return pos % 3 == 0; });
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
  // Adaptive length gives the same tokens.
  if (all_variants) EXPECT_EQ(generate(*m, &scripted, spec_options(4, true), greedy(prompt, n)).ids, ref);
}

}  // namespace

TEST(SpecGreedy, TinyS0EqualsNonSpeculative) { check_fixture("tiny-s0", 24, true, true); }

TEST(SpecGreedy, TinyLongEqualsNonSpeculative) { check_fixture("tiny-long", 12, false, false); }

// Eight sequences in one scheduler: speculation off, server default, k = 1..4, different
// acceptance (the scripted drafter errs at different rates per sequence), one seeded sampled
// request. Every greedy sequence must equal its own engine reference; the sampled one must equal
// the same request run alone.
TEST(SpecGreedy, BatchOfEightWithMixedSettings) {
  auto m = test_support::load_tiny("tiny-s0");
  const auto base = test_support::golden_ids("tiny-s0", "prompt_ids");
  const int64_t n = 20;
  const std::vector<int64_t> spec_tokens = {0, -1, 1, 2, 3, 4, 2, 1};
  std::vector<std::vector<int32_t>> prompts, refs;
  test_support::ScriptedDrafter::Truth truth;
  for (int i = 0; i < 8; ++i) {
    // Distinct prompt lengths tell the sequences apart for the scripted drafter.
    std::vector<int32_t> p(base.begin() + i * 3, base.end() - i * 2);
    prompts.push_back(p);
    refs.push_back(test_support::engine_greedy(*m, p, n));
    std::vector<int32_t> full = p;
    full.insert(full.end(), refs.back().begin(), refs.back().end());
    truth[static_cast<int64_t>(p.size())] = full;
  }
  // Sequence i's drafts are wrong at positions where (pos * (i + 2)) % (i + 3) == 0.
  std::map<int64_t, int> index_of;
  for (int i = 0; i < 8; ++i) index_of[static_cast<int64_t>(prompts[static_cast<size_t>(i)].size())] = i;
  test_support::ScriptedDrafter scripted(*m, truth, [index_of](int64_t len, int64_t pos) {
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
    chans.push_back(s.submit(i == 6 ? sampled_request() : greedy(prompts[static_cast<size_t>(i)], n, spec_tokens[static_cast<size_t>(i)])));
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
  EXPECT_GT(st.iterations_total, 0);
  s.stop();
  EXPECT_EQ(s.stats().pool_used_bytes, 0);
}

// Above --spec-disable-batch-size decoding sequences, greedy ones decode without drafts (same
// tokens), and the fall-back is counted.
TEST(SpecGreedy, WideBatchFallsBackWithoutChangingTokens) {
  auto m = test_support::load_tiny("tiny-s0");
  const auto base = test_support::golden_ids("tiny-s0", "prompt_ids");
  auto backend = spec::make_cpu_spec_backend(*m);
  auto so = spec_options(2, false);
  so.spec.disable_batch_size = 2;
  sched::Scheduler s(*m, so, backend.get());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < 3; ++i) {
    prompts.emplace_back(base.begin() + i, base.end());
    chans.push_back(s.submit(greedy(prompts.back(), 6)));
  }
  s.start();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(collect_ids(*chans[static_cast<size_t>(i)]), test_support::engine_greedy(*m, prompts[static_cast<size_t>(i)], 6));
  EXPECT_GT(s.stats().spec.fallback_steps, 0);
  EXPECT_EQ(s.stats().spec.verify_steps, 0);
}
