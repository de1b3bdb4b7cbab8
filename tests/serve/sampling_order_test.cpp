// Sampler over whole-vocabulary rows: the candidate order, weights and draws must equal a plain
// comparison-sort implementation of the same rules (larger logit first, lower id first among
// equal logits; weights exp(logit - max) in double, summed in candidate order; min-p, then top-p;
// one 53-bit uniform per draw from the sequence's mt19937_64), on rows full of ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "sched/sampling.h"

using dsv41::sched::Sampler;
using dsv41::sched::SamplingParams;
using dsv41::sched::TokenDistribution;

namespace {

constexpr int32_t kVocab = 129280;

// Logits rounded to a coarse grid (many exact ties), with signed zeros and a few -inf.
std::vector<float> tied_row(uint32_t seed, int32_t vocab = kVocab) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = std::round(n(g) * 8.0f) / 8.0f;
  for (int i = 0; i < 64; ++i) v[g() % v.size()] = (i % 2) ? -0.0f : 0.0f;
  for (int i = 0; i < 16; ++i) v[g() % v.size()] = -std::numeric_limits<float>::infinity();
  return v;
}

TokenDistribution reference(const std::vector<float>& logits, const SamplingParams& p) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<float> w(logits);
  float m = -std::numeric_limits<float>::infinity();
  for (float& x : w) {
    x *= static_cast<float>(1.0 / p.temperature);
    m = std::max(m, x);
  }
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
  if (p.top_k > 0 && p.top_k < vocab) ids.resize(static_cast<size_t>(p.top_k));
  while (!ids.empty() && std::isinf(w[ids.back()]) && w[ids.back()] < 0) ids.pop_back();
  std::vector<double> q;
  double sum = 0.0;
  for (int32_t id : ids) sum += q.emplace_back(std::exp(static_cast<double>(w[id]) - m));
  for (double& x : q) x /= sum;
  size_t n = q.size();
  if (p.min_p > 0.0)
    while (n > 1 && q[n - 1] < p.min_p * q[0]) --n;
  if (p.top_p < 1.0) {
    double c = 0.0;
    size_t i = 0;
    while (i < n && (c += q[i]) < p.top_p) ++i;
    n = std::min(n, i + 1);
  }
  TokenDistribution d;
  d.ids.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
  d.weights.assign(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
  for (double x : d.weights) d.total += x;
  return d;
}

// The candidate whose cumulative weight interval holds u·total (the last one if rounding leaves
// none), written here apart from TokenDistribution::pick.
int32_t reference_pick(const TokenDistribution& d, double u) {
  const double x = u * d.total;
  double c = 0.0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    c += d.weights[i];
    if (x < c) return d.ids[i];
  }
  return d.ids.back();
}

}  // namespace

TEST(SamplingOrder, WholeVocabularyRowsMatchAComparisonSort) {
  struct Case {
    double temperature, top_p, min_p;
    int64_t top_k;
  };
  const Case cases[] = {{1.0, 1.0, 0.0, 0},      {0.7, 1.0, 0.0, 0},    {1.3, 0.9, 0.0, 0},
                        {1.0, 1.0, 0.02, 0},     {0.8, 0.95, 0.01, 0},  {1.0, 1.0, 0.0, 50},
                        {1.0, 1.0, 0.0, 1024},   {1.0, 1.0, 0.0, 1025}, {0.9, 0.99, 0.0, 40000},
                        {1.0, 1.0, 0.0, kVocab}, {2.0, 1.0, 0.0, kVocab - 1}};
  for (uint32_t seed : {1u, 2u}) {
    const std::vector<float> row = tied_row(seed);
    for (const Case& c : cases) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << " T " << c.temperature << " top_p " << c.top_p
                                      << " min_p " << c.min_p << " top_k " << c.top_k);
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.top_k = c.top_k;
      const TokenDistribution want = reference(row, p);
      const TokenDistribution got = Sampler(p, {}).distribution(row);
      ASSERT_EQ(got.ids.size(), want.ids.size());
      EXPECT_EQ(got.ids, want.ids);
      EXPECT_EQ(got.weights, want.weights);  // bit for bit: same terms, same summation order
      EXPECT_EQ(got.total, want.total);
    }
  }
}

TEST(SamplingOrder, SeededDrawsFollowTheSequenceStream) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.97;
  p.has_seed = true;
  p.seed = 4242;
  Sampler s(p, {});
  std::mt19937_64 rng(p.seed);
  for (uint32_t step = 0; step < 6; ++step) {
    const std::vector<float> row = tied_row(100 + step);
    const int32_t want = reference_pick(reference(row, p), static_cast<double>(rng() >> 11) * 0x1.0p-53);
    EXPECT_EQ(s.sample(row).id, want) << "step " << step;
  }
}

TEST(SamplingOrder, NanLogitsAreNeverCandidates) {
  std::vector<float> row = tied_row(7, 4096);
  for (int i = 0; i < 4096; i += 3) row[static_cast<size_t>(i)] = std::numeric_limits<float>::quiet_NaN();
  SamplingParams p;
  p.has_seed = true;
  const TokenDistribution d = Sampler(p, {}).distribution(row);
  ASSERT_FALSE(d.ids.empty());
  for (int32_t id : d.ids) EXPECT_NE(id % 3, 0) << id;
  EXPECT_TRUE(std::isfinite(d.total));
}
