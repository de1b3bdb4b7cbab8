// Pearson's chi-square goodness-of-fit test for the speculative sampling tests: observed counts
// against expected probabilities, cells with small expectations pooled into one.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace dsv41::test_support {

struct ChiSquare {
  double statistic = 0.0;
  int df = 0;
  double critical = 0.0;  // the statistic's 1 - alpha quantile under the null hypothesis
  bool rejects() const { return statistic > critical; }
};

// Upper quantile of chi-square(df) by the Wilson–Hilferty approximation; z = the normal quantile
// of 1 - alpha (4.265 for alpha = 1e-5: the correct sampler almost never fails by chance).
inline double chi_square_quantile(int df, double z) {
  const double k = df, a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// counts: token -> occurrences over n draws; expected: token -> probability (sums to 1).
inline ChiSquare chi_square(const std::map<int32_t, int64_t>& counts, const std::map<int32_t, double>& expected,
                            int64_t n, double z = 4.265) {
  ChiSquare r;
  double pooled_e = 0.0, pooled_o = 0.0;
  int cells = 0;
  for (const auto& [id, p] : expected) {
    const double e = p * static_cast<double>(n);
    const auto it = counts.find(id);
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    if (e < 5.0) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    r.statistic += (o - e) * (o - e) / e;
    ++cells;
  }
  // Tokens drawn that have no expected mass at all: pool them with the small cells.
  for (const auto& [id, c] : counts)
    if (!expected.count(id)) pooled_o += static_cast<double>(c);
  if (pooled_e > 0.0 || pooled_o > 0.0) {
    const double e = std::max(pooled_e, 1e-9);
    r.statistic += (pooled_o - e) * (pooled_o - e) / e;
    ++cells;
  }
  r.df = std::max(1, cells - 1);
  r.critical = chi_square_quantile(r.df, z);
  return r;
}

}  // namespace dsv41::test_support
