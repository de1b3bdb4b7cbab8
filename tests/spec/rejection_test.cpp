// The acceptance rule of speculative sampling on hand-made distributions: the emitted token must
// follow the target distribution p whatever the draft distribution q is, and the chi-square
// harness used for that must reject rules that get it wrong.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>

#include "chi_square.h"
#include "spec/rejection.h"

using namespace dsv41;
using sched::TokenDistribution;

namespace {

TokenDistribution dist(std::vector<int32_t> ids, std::vector<double> w) {
  TokenDistribution d;
  d.ids = std::move(ids);
  d.weights = std::move(w);
  for (double x : d.weights) d.total += x;
  return d;
}

using Rule = std::function<int32_t(const TokenDistribution& p, const TokenDistribution& q, int32_t d,
                                   const std::function<double()>& u)>;

// n draws: d ~ q, then `rule` decides the emitted token; chi-square of the emitted tokens vs p.
test_support::ChiSquare run(const TokenDistribution& p, const TokenDistribution& q, const Rule& rule, int64_t n,
                            uint64_t seed) {
  std::mt19937_64 g(seed);
  auto u = [&g] { return static_cast<double>(g() >> 11) * 0x1.0p-53; };
  std::map<int32_t, int64_t> counts;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t d = q.pick(u());
    ++counts[rule(p, q, d, u)];
  }
  std::map<int32_t, double> expected;
  for (size_t i = 0; i < p.ids.size(); ++i) expected[p.ids[i]] = p.weights[i] / p.total;
  return test_support::chi_square(counts, expected, n);
}

int32_t correct_rule(const TokenDistribution& p, const TokenDistribution& q, int32_t d,
                     const std::function<double()>& u) {
  return spec::accept_or_resample(p, q, d, u).token;
}

// Overlapping supports with different shapes; q puts mass where p has none (token 9).
const TokenDistribution kP = dist({3, 1, 4, 5, 2}, {0.35, 0.25, 0.2, 0.15, 0.05});
const TokenDistribution kQ = dist({1, 9, 3, 2, 4}, {0.4, 0.2, 0.2, 0.15, 0.05});

}  // namespace

TEST(Rejection, EmittedTokensFollowTheTargetDistribution) {
  const auto r = run(kP, kQ, correct_rule, 200000, 1);
  EXPECT_FALSE(r.rejects()) << "chi2 " << r.statistic << " > " << r.critical;
  // Same draft and target: everything is accepted.
  int calls = 0;
  auto u = [&calls] { ++calls; return 0.999; };
  const auto v = spec::accept_or_resample(kP, kP, 3, u);
  EXPECT_TRUE(v.accepted);
  EXPECT_EQ(v.token, 3);
}

TEST(Rejection, TheHarnessRejectsWrongAcceptanceRules) {
  // Accept every draft: emits q, not p.
  const Rule always_accept = [](const TokenDistribution&, const TokenDistribution&, int32_t d,
                                const std::function<double()>&) { return d; };
  // Right acceptance test, but a rejected draft is replaced by a fresh draw from p (not from the
  // residual max(p - q, 0)): over-weights tokens both like.
  const Rule resample_from_p = [](const TokenDistribution& p, const TokenDistribution& q, int32_t d,
                                  const std::function<double()>& u) {
    if (u() * q.prob(d) < p.prob(d)) return d;
    return p.pick(u());
  };
  // Accept with probability min(1, q/p) (ratio inverted).
  const Rule inverted = [](const TokenDistribution& p, const TokenDistribution& q, int32_t d,
                           const std::function<double()>& u) {
    if (p.prob(d) > 0 && u() * p.prob(d) < q.prob(d)) return d;
    return spec::accept_or_resample(p, dist({d}, {1.0}), -1, u).token;
  };
  for (const auto& [name, rule] : std::vector<std::pair<const char*, Rule>>{
           {"always accept", always_accept}, {"resample from p", resample_from_p}, {"inverted ratio", inverted}}) {
    const auto r = run(kP, kQ, rule, 200000, 2);
    EXPECT_TRUE(r.rejects()) << name << ": chi2 " << r.statistic << " <= " << r.critical;
  }
}

TEST(Rejection, GreedyTargetDecidesWithoutRandomness) {
  const TokenDistribution p = dist({7}, {1.0});
  int calls = 0;
  auto u = [&calls] { ++calls; return 0.5; };
  auto v = spec::accept_or_resample(p, kQ, 7, u);
  EXPECT_TRUE(v.accepted);
  EXPECT_EQ(v.token, 7);
  v = spec::accept_or_resample(p, kQ, 3, u);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 7);
  EXPECT_EQ(calls, 0);
}

TEST(Rejection, DraftOutsideTheTargetSupportIsAlwaysReplaced) {
  std::mt19937_64 g(3);
  auto u = [&g] { return static_cast<double>(g() >> 11) * 0x1.0p-53; };
  for (int i = 0; i < 1000; ++i) {
    const auto v = spec::accept_or_resample(kP, kQ, 9, u);
    ASSERT_FALSE(v.accepted);
    ASSERT_NE(v.token, 9);
    // The residual max(p - q, 0) is zero on token 1 (q(1) = 0.4 > p(1) = 0.25).
    ASSERT_NE(v.token, 1);
  }
}
