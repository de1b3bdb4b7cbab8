// Shared pieces of the CUDA model tests: the fixtures' stepping rule (prefill the prompt in chunks,
// then greedy decode) run on any backend with forward_sequence, and the comparisons the CPU engine's
// golden tests use (argmax per row, worst |a - b| relative to the reference row's range).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsv41::test {

struct Run {
  std::vector<float> prefill, decode;  // [S][V], [D][V]
  std::vector<int32_t> greedy;         // D+1 ids
};

inline int32_t argmax_row(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

// Prefill `prompt` in chunks of `chunk` (0 = one shot, prompt_len set so chunks use the one-shot
// layout), then `decode` greedy steps, one token each. With `forced` (another run's greedy ids),
// decode step i feeds forced[i] instead of this run's own argmax, so two runs compare step by step.
template <class M>
Run run_steps(M& m, const std::vector<int32_t>& prompt, int64_t chunk, int64_t decode,
              const std::vector<int32_t>* forced = nullptr) {
  const int64_t S = static_cast<int64_t>(prompt.size()), V = m.config().vocab_size;
  auto st = m.new_sequence();
  st->prompt_len = S;
  Run r;
  const int64_t step = chunk > 0 ? chunk : S;
  for (int64_t s0 = 0; s0 < S; s0 += step) {
    const int64_t n = std::min(step, S - s0);
    std::vector<float> lg;
    m.forward_sequence(*st, std::span<const int32_t>(prompt.data() + s0, static_cast<size_t>(n)), true, &lg);
    EXPECT_EQ(static_cast<int64_t>(lg.size()), n * V);
    r.prefill.insert(r.prefill.end(), lg.begin(), lg.end());
  }
  r.greedy.push_back(argmax_row(&r.prefill[(S - 1) * V], V));
  for (int64_t i = 0; i < decode; ++i) {
    std::vector<float> lg;
    const int32_t tok = forced ? forced->at(static_cast<size_t>(i)) : r.greedy.back();
    m.forward_sequence(*st, std::span<const int32_t>(&tok, 1), false, &lg);
    EXPECT_EQ(static_cast<int64_t>(lg.size()), V);
    r.decode.insert(r.decode.end(), lg.begin(), lg.end());
    r.greedy.push_back(argmax_row(lg.data(), V));
  }
  return r;
}

// Worst |got - ref| / (max - min of the ref row) over rows of width V.
inline double worst_rel(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  double worst = 0;
  EXPECT_EQ(got.size(), ref.size());
  for (size_t r0 = 0; r0 + V <= ref.size() && r0 + V <= got.size(); r0 += static_cast<size_t>(V)) {
    const auto [mn, mx] = std::minmax_element(ref.begin() + r0, ref.begin() + r0 + V);
    const double range = *mx - *mn;
    for (int64_t v = 0; v < V; ++v) {
      const double e = std::fabs(double(got[r0 + v]) - double(ref[r0 + v]));
      worst = std::max(worst, std::isfinite(e) ? e / range : INFINITY);
    }
  }
  return worst;
}

// Rows whose argmax differs.
inline int argmax_mismatches(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  int bad = 0;
  for (size_t r0 = 0; r0 + V <= ref.size() && r0 + V <= got.size(); r0 += static_cast<size_t>(V))
    bad += argmax_row(&got[r0], V) != argmax_row(&ref[r0], V);
  return bad;
}

// Fraction of values that are bit-identical.
inline double identical_fraction(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 0.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

}  // namespace dsv41::test
