// GPU parity of the index top-k replay (kernels/ops/topk_replay.cu) against the CPU engine's
// selection (model::torch_topk_indices / topk_sorted, themselves checked against the standard
// library in tests/model/topk_test.cpp), in both of its branches (nth_element below 64·k columns,
// partial_sort's heap from there): the same entries among ties, and, in the test mode that
// returns positions 0..k-1 unsorted, the same order the algorithm leaves them in. Inputs are made to
// tie (bf16 index-like scores, prefill rows with -inf tails, few distinct values) and carry NaN,
// infinities and both zeros; one set reaches the introselect's depth-limit heap select. Each case
// runs with the row in shared memory and in global memory (the kernel's two placements).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "../support/introselect_cases.h"
#include "dsv41/common/error.h"
#include "harness.h"
#include "model/ops/topk.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Fill { kIndexScores, kPrefillTail, kFewValues, kDistinct, kSpecials };

std::vector<float> make_row(Fill f, int64_t n, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(n));
  switch (f) {
    case Fill::kIndexScores:  // relu'd bf16 sums: many exact zeros and repeated small values
      for (float& x : v) x = bf16_round(std::max(0.0f, rng.normal(1.0f)) * 0.25f);
      break;
    case Fill::kPrefillTail: {  // a prefill row: visible bf16 scores, then unseen columns at -inf
      const int64_t visible = 1 + rng.below(n);
      for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = j < visible ? bf16_round(rng.normal(2.0f)) : -kInf;
      break;
    }
    case Fill::kFewValues:
      for (float& x : v) x = static_cast<float>(rng.below(5)) - 2.0f;
      break;
    case Fill::kDistinct:
      for (float& x : v) x = rng.normal(3.0f);
      break;
    case Fill::kSpecials: {
      const float specials[] = {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf, 0.0f, -0.0f, 1.0f, -1.0f};
      for (float& x : v) x = rng.below(3) == 0 ? specials[rng.below(7)] : bf16_round(rng.normal(1.0f));
      break;
    }
  }
  return v;
}

// Runs the replay on `rows` rows of n values; returns [rows][k].
std::vector<int32_t> gpu_replay(const std::vector<float>& vals, int64_t rows, int64_t n, int64_t k, int64_t pos0,
                                int64_t ratio, bool in_select_order, bool force_global, const std::string& what) {
  const int64_t stride = n + 3;  // rows not packed: the kernel must follow the stride
  std::vector<float> padded(static_cast<size_t>(rows * stride), 7.0f);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(vals.begin() + r * n, n, padded.begin() + r * stride);
  DeviceBuffer dv = DeviceBuffer::from(padded);
  Guarded didx(static_cast<size_t>(rows * stride) * 2), dout(static_cast<size_t>(rows * k) * 4);
  gpu::TopkReplayArgs a;
  a.values = dv.as<float>();
  a.idx = didx.as<uint16_t>();
  a.rows = rows;
  a.n = n;
  a.stride = stride;
  a.k = k;
  a.pos0 = pos0;
  a.ratio = ratio;
  a.in_select_order = in_select_order;
  a.force_global = force_global;
  a.out = dout.as<int32_t>();
  gpu::topk_replay(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  expect_guards(what + " idx", didx);
  expect_guards(what + " out", dout);
  return dout.host<int32_t>();
}

// What the CPU engine selects for row r: the algorithm's order, or sorted with the visibility rule.
std::vector<int32_t> cpu_select(const std::vector<float>& row, int64_t k, int64_t n_vis, bool in_select_order) {
  if (in_select_order) return model::torch_topk_indices(row, k);
  std::vector<int32_t> sel = model::topk_sorted(row, k);
  for (int32_t& e : sel)
    if (e >= n_vis) e = -1;
  return sel;
}

void check_rows(const std::vector<float>& vals, int64_t rows, int64_t n, int64_t k, int64_t pos0, int64_t ratio,
                const std::string& what) {
  ASSERT_TRUE(gpu::topk_replay_fits(n, k)) << what;
  for (bool order : {false, true}) {
    std::vector<int32_t> want;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row(vals.begin() + r * n, vals.begin() + (r + 1) * n);
      const int64_t n_vis = ratio > 0 ? (pos0 + r + 1) / ratio : n;
      const std::vector<int32_t> sel = cpu_select(row, k, n_vis, order);
      want.insert(want.end(), sel.begin(), sel.end());
    }
    // both placements of the row: shared memory (where it fits) and global memory
    for (bool global : {false, true}) {
      const std::string w = what + (order ? " (select order" : " (sorted") + (global ? ", global)" : ")");
      expect_equal(w, gpu_replay(vals, rows, n, k, pos0, ratio, order, global, w), want);
    }
  }
}

TEST(GpuTopkReplay, SameEntriesAndOrderAsTheCpuEngine) {
  const std::pair<int64_t, int64_t> shapes[] = {
      {4, 1}, {5, 5}, {37, 3}, {64, 2}, {513, 17}, {2048, 512}, {4096, 512}, {16384, 512}, {32767, 512}, {65535, 1024},
      {3000, 2999}, {60, 1},
      // the partial_sort branch (k·64 <= n), past the uint16 range too
      {64, 1}, {200, 3}, {4096, 64}, {9000, 140}, {32768, 512}, {70001, 512}, {131072, 512}};
  const Fill fills[] = {Fill::kIndexScores, Fill::kPrefillTail, Fill::kFewValues, Fill::kDistinct, Fill::kSpecials};
  uint64_t seed = 1;
  for (const auto& [n, k] : shapes)
    for (Fill f : fills) {
      Rng rng(seed++);
      const int64_t rows = n > 20000 ? 2 : 5;
      std::vector<float> v;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> row = make_row(f, n, rng);
        v.insert(v.end(), row.begin(), row.end());
      }
      const std::string what = "replay n=" + std::to_string(n) + " k=" + std::to_string(k) + " fill " +
                               std::to_string(static_cast<int>(f));
      SCOPED_TRACE(what);
      check_rows(v, rows, n, k, 0, 0, what);
    }
}

TEST(GpuTopkReplay, VisibilityRuleAndDepthLimitHeapSelect) {
  // The indexer's rule: entries at or past (pos0 + row + 1) / ratio come out as -1.
  {
    Rng rng(77);
    const int64_t n = 3000, k = 512, rows = 4;
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row = make_row(Fill::kIndexScores, n, rng);
      v.insert(v.end(), row.begin(), row.end());
    }
    check_rows(v, rows, n, k, 1700, 2, "replay visibility ratio 2");
  }
  // Inputs on which the library's introselect runs out of partition rounds (heap select).
  for (const auto& [v, k] : introselect_depth_limit_cases()) {
    const int64_t n = static_cast<int64_t>(v.size());
    check_rows(v, 1, n, k, 0, 0, "replay depth limit n=" + std::to_string(n));
  }
}

// Batched decode: each row's width is (position + 1) / ratio within a common stride (the rest of
// the stride holds NaN, which must not count), outputs packed one after another.
void check_batched(int64_t ratio, int64_t k, const std::vector<int64_t>& positions, uint64_t seed,
                   const std::string& what) {
  int64_t t_max = 0;
  for (int64_t p : positions) t_max = std::max(t_max, (p + 1) / ratio);
  const int64_t rows = static_cast<int64_t>(positions.size());
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows * t_max), std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> want;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = (positions[static_cast<size_t>(r)] + 1) / ratio;
    const std::vector<float> row = make_row(Fill::kIndexScores, n, rng);
    std::copy(row.begin(), row.end(), v.begin() + r * t_max);
    if (n == 0) continue;
    const std::vector<int32_t> sel = model::topk_sorted(row, std::min(k, n));
    want.insert(want.end(), sel.begin(), sel.end());
  }
  DeviceBuffer dv = DeviceBuffer::from(v), dpos = DeviceBuffer::from(positions);
  Guarded didx(v.size() * 2), dout(want.size() * 4);
  gpu::TopkReplayArgs a;
  a.values = dv.as<float>();
  a.idx = didx.as<uint16_t>();
  a.rows = rows;
  a.n = t_max;
  a.stride = t_max;
  a.k = std::min(k, t_max);
  a.ratio = ratio;
  a.positions = dpos.as<int64_t>();
  a.out = dout.as<int32_t>();
  gpu::topk_replay(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  expect_guards(what + " idx", didx);
  expect_guards(what + " out", dout);
  expect_equal(what, dout.host<int32_t>(), want);
}

TEST(GpuTopkReplay, BatchedDecodeRowsOfTheirOwnWidth) {
  check_batched(2, 512, {4095, 1000, 0, 2047, 3, 1500}, 91, "replay batched decode rows");
  // long contexts: rows of both branches in one call (32,768 columns and more take partial_sort)
  check_batched(1, 512, {40000, 1000, 32767, 70000, 0, 5, 32766}, 92, "replay batched decode rows, both branches");
}

TEST(GpuTopkReplay, RejectsShapesOutsideBothBranches) {
  EXPECT_FALSE(gpu::topk_replay_fits(70000, 2000));  // nth_element past the uint16 index scratch
  EXPECT_FALSE(gpu::topk_replay_fits(64 * 5000, 5000));  // partial_sort: a heap past shared memory's share
  EXPECT_FALSE(gpu::topk_replay_fits(10, 0));
  EXPECT_FALSE(gpu::topk_replay_fits(10, 11));
  EXPECT_TRUE(gpu::topk_replay_fits(32767, 512));
  EXPECT_TRUE(gpu::topk_replay_fits(32768, 512));
  EXPECT_TRUE(gpu::topk_replay_fits(1 << 20, 512));
  gpu::TopkReplayArgs a;
  a.rows = 1;
  a.n = 70000;
  a.stride = 70000;
  a.k = 2000;
  EXPECT_THROW(gpu::topk_replay(a, nullptr), Error);
}

}  // namespace
}  // namespace dsv41::test
