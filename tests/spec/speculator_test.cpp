// SeqSpeculator and DraftPolicy on hand-made drafter/target rows (vocabulary of 8).
#include <gtest/gtest.h>

#include "serve/metrics.h"
#include "spec/speculator.h"

using namespace dsv41;

namespace {

constexpr int64_t V = 8;

// A draft of `block` rows whose argmax chain is `chain` (ids[0] = anchor).
spec::Draft make_draft(std::vector<int32_t> chain, std::vector<float> conf) {
  spec::Draft d;
  d.ids = chain;
  const size_t block = chain.size() - 1;
  d.logits.assign(block * V, 0.0f);
  for (size_t i = 0; i < block; ++i) d.logits[i * V + static_cast<size_t>(chain[i + 1])] = 5.0f;
  d.confidence = std::move(conf);
  return d;
}

// Target rows whose argmax is `best[i]`.
std::vector<float> rows_with_argmax(const std::vector<int32_t>& best) {
  std::vector<float> r(best.size() * V, 0.0f);
  for (size_t i = 0; i < best.size(); ++i) r[i * V + static_cast<size_t>(best[i])] = 3.0f;
  return r;
}

spec::SpecOptions fixed() {
  spec::SpecOptions o;
  o.method = spec::SpecMethod::dspark;
  o.adaptive = false;
  return o;
}

sched::SamplingParams greedy_params() {
  sched::SamplingParams p;
  p.temperature = 0;
  return p;
}

}  // namespace

TEST(Speculator, GreedyAcceptsTheLongestMatchingPrefix) {
  sched::Sampler s(greedy_params(), {});
  spec::SeqSpeculator sp(fixed(), 4);
  ASSERT_EQ(sp.propose(make_draft({1, 2, 3, 4, 5}, {0, 0, 0, 0}), 3, s, {}, 0), 3);
  EXPECT_EQ(std::vector<int32_t>(sp.verify_tokens().begin(), sp.verify_tokens().end()), (std::vector<int32_t>{1, 2, 3, 4}));
  // Target agrees on d1, disagrees on d2 (wants 6): commits d1 and 6.
  auto out = sp.verify(rows_with_argmax({2, 6, 0, 0}), V, s, {}, 0);
  EXPECT_EQ(out.accepted, 1);
  ASSERT_EQ(out.tokens.size(), 2u);
  EXPECT_EQ(out.tokens[0].id, 2);
  EXPECT_EQ(out.tokens[1].id, 6);
  // Everything accepted: the bonus comes from the last row.
  ASSERT_EQ(sp.propose(make_draft({1, 2, 3, 4, 5}, {0, 0, 0, 0}), 2, s, {}, 0), 2);
  out = sp.verify(rows_with_argmax({2, 3, 7}), V, s, {}, 0);
  EXPECT_EQ(out.accepted, 2);
  ASSERT_EQ(out.tokens.size(), 3u);
  EXPECT_EQ(out.tokens[2].id, 7);
  // Nothing accepted.
  ASSERT_EQ(sp.propose(make_draft({1, 2, 3}, {0, 0}), 2, s, {}, 0), 2);
  out = sp.verify(rows_with_argmax({5, 3, 0}), V, s, {}, 0);
  EXPECT_EQ(out.accepted, 0);
  ASSERT_EQ(out.tokens.size(), 1u);
  EXPECT_EQ(out.tokens[0].id, 5);
}

TEST(Speculator, ChainStopsWhereTheRequestChangesTheDraftersChoice) {
  // A logit bias moves the processed argmax of row 1 away from the drafter's own choice 3: the
  // Markov bias of row 2 assumed 3, so drafting stops after the replaced draft.
  sched::SamplingParams p = greedy_params();
  p.logit_bias[6] = 10.0f;
  sched::Sampler s(p, {});
  spec::SeqSpeculator sp(fixed(), 4);
  EXPECT_EQ(sp.propose(make_draft({1, 2, 3, 4, 5}, {0, 0, 0, 0}), 4, s, {}, 0), 1);
  EXPECT_EQ(sp.verify_tokens()[1], 6);
  // Bans below min_tokens apply to drafts too (EOS 2 banned for the first generated token).
  sched::Sampler s2(greedy_params(), {});
  spec::BanRule bans{1, {2}};
  EXPECT_EQ(sp.propose(make_draft({1, 2, 3, 4, 5}, {0, 0, 0, 0}), 4, s2, bans, 0), 1);
  EXPECT_NE(sp.verify_tokens()[1], 2);
  // The cap and the block bound k; truncate() shortens.
  EXPECT_EQ(sp.propose(make_draft({1, 2, 3, 4, 5}, {0, 0, 0, 0}), 2, s2, {}, 5), 2);
  sp.truncate(1);
  EXPECT_EQ(sp.k(), 1);
  spec::SpecOptions o = fixed();
  o.max_draft_tokens = 9;
  spec::SeqSpeculator wide(o, 4);
  EXPECT_EQ(wide.max_drafts(), 4);
}

TEST(DraftPolicy, ConfidenceAndRunningAcceptanceSetTheLength) {
  spec::DraftPolicy p(0.3);
  EXPECT_EQ(p.choose(std::vector<float>{4, 4, 4, 4}, 4), 4);     // sigmoid(4) = 0.98 each
  EXPECT_EQ(p.choose(std::vector<float>{4, 4, 4, 4}, 2), 2);     // capped
  EXPECT_EQ(p.choose(std::vector<float>{-3, -3, -3, -3}, 4), 1);  // at least one
  EXPECT_EQ(p.choose(std::vector<float>{1, 0, -1, 4}, 4), 2);    // 0.73, then 0.73 * 0.5 = 0.37, then 0.13
  // A sequence whose drafts keep failing although the head is confident: the calibration lowers
  // the estimates, then complete rejections pause drafting.
  const std::vector<float> confident{3, 3, 3, 3};
  int paused_after = -1;
  for (int i = 0; i < 40 && paused_after < 0; ++i) {
    p.observe(confident, 4, 0);
    if (p.paused()) paused_after = i;
  }
  ASSERT_GE(paused_after, 0);
  EXPECT_LT(p.choose(confident, 4), 4);
  int waited = 0;
  while (p.paused()) {
    p.skipped_step();
    ++waited;
  }
  EXPECT_GE(waited, 1);
  // Success lifts the estimate again.
  for (int i = 0; i < 30; ++i) p.observe(confident, 4, 4);
  EXPECT_EQ(p.choose(confident, 4), 4);
  EXPECT_GT(p.observed_acceptance(), 0.9);
}

TEST(SpecMetrics, RenderedOnMetricsWithPerKHistograms) {
  spec::SpecStats st;
  st.record(2, 1);
  st.record(2, 2);
  st.record(4, 0);
  st.fallback_steps = 3;
  std::string out;
  serve::render_spec_metrics(out, st, "model_name=\"m\"");
  EXPECT_NE(out.find("vllm:spec_decode_num_drafts_total{model_name=\"m\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 8\n"), std::string::npos);
  EXPECT_NE(out.find("vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 3\n"), std::string::npos);
  EXPECT_NE(out.find("dsv41:spec_decode_acceptance_rate{model_name=\"m\"} 0.375\n"), std::string::npos);
  EXPECT_NE(out.find("dsv41:spec_decode_mean_accepted_length{model_name=\"m\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(out.find("dsv41:spec_decode_accepted_drafts_bucket{model_name=\"m\",k=\"2\",le=\"1\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("dsv41:spec_decode_accepted_drafts_bucket{model_name=\"m\",k=\"2\",le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("dsv41:spec_decode_accepted_drafts_sum{model_name=\"m\",k=\"2\"} 3\n"), std::string::npos);
  EXPECT_NE(out.find("dsv41:spec_decode_accepted_drafts_bucket{model_name=\"m\",k=\"4\",le=\"0\"} 1\n"), std::string::npos);
  EXPECT_EQ(out.find("k=\"3\""), std::string::npos);  // no steps with k = 3
  EXPECT_NE(out.find("dsv41:spec_decode_fallback_steps_total{model_name=\"m\"} 3\n"), std::string::npos);
}
