// The reference's top-k (PyTorch CPU topk: (value, index) pairs ranked by value, NaN on top, by
// std::partial_sort when k·64 <= n else std::nth_element) against model::torch_topk_indices /
// topk_sorted, whose partial_sort and nth_element branches replay the library's steps themselves. The oracle below
// is the reference's recipe run on the standard library; inputs are full of exact ties, as the
// indexer's bf16 scores are, so any other tie rule fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "dsv41/common/numeric.h"
#include "../support/introselect_cases.h"
#include "model/ops/topk.h"

namespace dsv41::model {
namespace {

std::vector<int32_t> library_topk(const std::vector<float>& values, int64_t k) {
  using Elem = std::pair<float, int64_t>;
  const int64_t n = static_cast<int64_t>(values.size());
  k = std::min(k, n);
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[static_cast<size_t>(j)] = {values[static_cast<size_t>(j)], j};
  auto greater = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
  };
  if (k * 64 <= n) std::partial_sort(q.begin(), q.begin() + k, q.end(), greater);
  else std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), greater);
  std::vector<int32_t> out;
  for (int64_t j = 0; j < k; ++j) out.push_back(static_cast<int32_t>(q[static_cast<size_t>(j)].second));
  return out;
}

std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Few distinct levels plus NaN, ±inf and ±0 in random places.
std::vector<float> tied_values(std::mt19937& g, int64_t n, int levels) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) {
    const int r = static_cast<int>(g() % 100);
    if (r < 2) e = NAN;
    else if (r < 4) e = -INFINITY;
    else if (r < 6) e = INFINITY;
    else if (r < 8) e = (r & 1) ? -0.0f : 0.0f;
    else e = static_cast<float>(static_cast<int>(g() % static_cast<uint32_t>(levels)) - levels / 3) * 0.25f;
  }
  return v;
}

// Index scores as the indexer makes them: bf16 sums of relu'd bf16 head terms, many exact zeros.
std::vector<float> index_like_scores(std::mt19937& g, int64_t n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) {
    float acc = 0.0f;
    for (int h = 0; h < 4; ++h) acc += bf16_round(std::max(bf16_round(nd(g)), 0.0f) * 0.3f);
    e = bf16_round(acc);
  }
  return v;
}

TEST(TopK, MatchesTheLibraryOnTiedInputs) {
  std::mt19937 g(11);
  int checked_heap = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(g() % 3000);
    int64_t k = 1 + static_cast<int64_t>(g() % static_cast<uint32_t>(std::max<int64_t>(1, n / 64)));
    if (trial % 5 == 0) k = 1 + static_cast<int64_t>(g() % static_cast<uint32_t>(n));
    const std::vector<float> v = tied_values(g, n, 1 + static_cast<int>(g() % 20));
    const std::vector<int32_t> want = library_topk(v, k);
    ASSERT_EQ(torch_topk_indices(v, k), want) << "trial " << trial << " n=" << n << " k=" << k;
    ASSERT_EQ(topk_sorted(v, k), sorted(want)) << "trial " << trial << " n=" << n << " k=" << k;
    checked_heap += k * 64 <= n;
  }
  EXPECT_GT(checked_heap, 2000);  // most trials ran the heap branch
}

TEST(TopK, HeapBoundaryAndRunEdges) {
  // k·64 == n (heap branch) and n one past it; n not a multiple of the 64-entry runs; a NaN top.
  std::mt19937 g(5);
  for (int64_t k : {1, 2, 3, 7, 8, 64}) {
    for (int64_t n : {k * 64, k * 64 + 1, k * 64 + 63, k * 64 - 1}) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> v = tied_values(g, n, 3);
        ASSERT_EQ(torch_topk_indices(v, k), library_topk(v, k)) << "n=" << n << " k=" << k;
      }
    }
  }
  std::vector<float> nans(640, NAN);
  nans[100] = 1.0f;
  EXPECT_EQ(torch_topk_indices(nans, 10), library_topk(nans, 10));
  EXPECT_TRUE(torch_topk_indices(std::vector<float>{}, 4).empty());
  EXPECT_TRUE(topk_sorted(std::vector<float>{1.0f}, 0).empty());
}

TEST(TopK, LongContextIndexScoresKeepTheLibrarysTies) {
  // The decode step's host point at 128k: 65,536 bf16 scores, k = 512, with ties straddling the
  // k-th value, so the survivors among the tied entries are decided by the heap's layout.
  std::mt19937 g(2);
  for (int rep = 0; rep < 3; ++rep) {
    const std::vector<float> v = index_like_scores(g, 65536);
    const std::vector<int32_t> want = library_topk(v, 512);
    const float kth = v[static_cast<size_t>(want.back())];
    int64_t above = 0, equal = 0;
    for (float e : v) above += e > kth, equal += e == kth;
    ASSERT_GT(above + equal, 512) << "no tie straddles the boundary: the case does not test tie order";
    EXPECT_EQ(torch_topk_indices(v, 512), want);
    EXPECT_EQ(topk_sorted(v, 512), sorted(want));
    // "lowest index wins among ties" is a different selection: the tie rule is what is tested
    std::vector<int32_t> lowest;
    for (int32_t j = 0; j < 65536; ++j)
      if (v[static_cast<size_t>(j)] > kth) lowest.push_back(j);
    for (int32_t j = 0; j < 65536 && static_cast<int64_t>(lowest.size()) < 512; ++j)
      if (v[static_cast<size_t>(j)] == kth) lowest.push_back(j);
    EXPECT_NE(sorted(lowest), sorted(want)) << "the lowest-index rule agrees here: the case does not test tie order";
  }
}

TEST(TopK, NthElementBranchAtIndexScoreSizes) {
  // Prefill rows of a 2k-32k context (k = 512, k·64 > n): the nth_element replay against the
  // library on bf16 scores whose ties straddle the k-th value.
  std::mt19937 g(3);
  for (int64_t n : {513, 2048, 4095, 16384, 32767}) {
    for (int rep = 0; rep < 3; ++rep) {
      const std::vector<float> v = index_like_scores(g, n);
      const std::vector<int32_t> want = library_topk(v, 512);
      EXPECT_EQ(torch_topk_indices(v, 512), want) << "n=" << n << " rep " << rep;
      EXPECT_EQ(topk_sorted(v, 512), sorted(want)) << "n=" << n << " rep " << rep;
    }
  }
  // Early prefill rows: the layout's columns past the row's position score -inf (long runs of
  // entries equal to a -inf pivot, which the replay swaps in blocks).
  for (int64_t n : {4096, 16384}) {
    for (int64_t visible : {n / 64, n / 16, n / 4, n - 1}) {
      std::vector<float> v = index_like_scores(g, n);
      std::fill(v.begin() + visible, v.end(), -INFINITY);
      const std::vector<int32_t> want = library_topk(v, 512);
      EXPECT_EQ(torch_topk_indices(v, 512), want) << "n=" << n << " visible " << visible;
      EXPECT_EQ(topk_sorted(v, 512), sorted(want)) << "n=" << n << " visible " << visible;
    }
  }
}

TEST(TopK, DepthLimitHeapSelectMatchesTheLibrary) {
  // Inputs on which the library's introselect runs out of its partition rounds (heap select).
  for (const auto& [v, k] : test::introselect_depth_limit_cases()) {
    EXPECT_EQ(torch_topk_indices(v, k), library_topk(v, k)) << "n=" << v.size() << " k=" << k;
    EXPECT_EQ(topk_sorted(v, k), sorted(library_topk(v, k))) << "n=" << v.size() << " k=" << k;
  }
}

}  // namespace
}  // namespace dsv41::model
