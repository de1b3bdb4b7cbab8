// Sampler: greedy, seeds, top-k/top-p/min-p, penalties, logprobs against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "sched/sampling.h"

using dsv41::sched::Sampler;
using dsv41::sched::SamplingParams;

namespace {

std::vector<float> row() { return {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 1.9f, -3.0f, 0.7f}; }

std::vector<int32_t> draw(SamplingParams p, int n, std::vector<float> logits = row()) {
  Sampler s(p, {});
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits).id);
  return out;
}

}  // namespace

TEST(Sampling, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(draw(p, 3), (std::vector<int32_t>{1, 1, 1}));
  p.temperature = 1.0;
  p.top_k = 1;
  EXPECT_EQ(draw(p, 3), (std::vector<int32_t>{1, 1, 1}));
}

TEST(Sampling, SameSeedSameTokensOtherSeedOtherTokens) {
  SamplingParams p;
  p.temperature = 1.5;
  p.has_seed = true;
  p.seed = 1234;
  const auto a = draw(p, 64), b = draw(p, 64);
  EXPECT_EQ(a, b);
  p.seed = 99;
  EXPECT_NE(a, draw(p, 64));
}

TEST(Sampling, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0;
  p.has_seed = true;
  p.seed = 7;
  const auto l = row();
  const int n = 40000;
  std::map<int32_t, int> count;
  for (int32_t id : draw(p, n)) ++count[id];
  double z = 0;
  for (float v : l) z += std::exp(v);
  for (size_t i = 0; i < l.size(); ++i) {
    const double expect = std::exp(l[i]) / z;
    EXPECT_NEAR(count[static_cast<int32_t>(i)] / double(n), expect, 0.01) << "token " << i;
  }
}

TEST(Sampling, TopKTopPMinPRestrictTheSupport) {
  SamplingParams p;
  p.has_seed = true;
  p.top_k = 2;  // {1, 5}
  for (int32_t id : draw(p, 500)) EXPECT_TRUE(id == 1 || id == 5);
  p.top_k = 0;
  // softmax sorted: p1=.311 p5=.281 p3=.189 ... top_p 0.55 keeps {1, 5}
  p.top_p = 0.55;
  for (int32_t id : draw(p, 500)) EXPECT_TRUE(id == 1 || id == 5);
  p.top_p = 1.0;
  // min_p 0.5: keeps tokens with p >= 0.5 * p_max: e^(x-2) >= .5 -> x >= 1.307: {1, 5, 3}
  p.min_p = 0.5;
  std::map<int32_t, int> c;
  for (int32_t id : draw(p, 2000)) ++c[id];
  EXPECT_EQ(c.size(), 3u);
  EXPECT_GT(c[3], 0);
}

TEST(Sampling, PenaltiesMoveTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.2;  // token 1 drops by .2 per use: 2.0 -> 1.8 < 1.9 -> 5 wins next
  EXPECT_EQ(draw(p, 2), (std::vector<int32_t>{1, 5}));
  SamplingParams q;
  q.temperature = 0;
  q.repetition_penalty = 2.0;  // prompt has 1: 2.0 -> 1.0; 5 (1.9) wins
  Sampler s(q, std::vector<int32_t>{1});
  EXPECT_EQ(s.sample(row()).id, 5);
  SamplingParams b;
  b.temperature = 0;
  b.logit_bias[6] = 10.0f;
  EXPECT_EQ(draw(b, 1)[0], 6);
  SamplingParams ban;
  ban.temperature = 0;
  Sampler s2(ban, {});
  std::vector<int32_t> banned{1};
  EXPECT_EQ(s2.sample(row(), banned).id, 5);
}

TEST(Sampling, LogprobsAreLogSoftmaxOfRawLogits) {
  SamplingParams p;
  p.temperature = 0;
  p.top_logprobs = 3;
  p.presence_penalty = 1.0;  // processing does not change the reported logprobs
  Sampler s(p, {});
  const auto l = row();
  auto t = s.sample(l);
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(t.logprob, l[1] - std::log(z), 1e-5);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 5);
  EXPECT_EQ(t.top[2].first, 3);
  EXPECT_NEAR(t.top[2].second, l[3] - std::log(z), 1e-5);
}
