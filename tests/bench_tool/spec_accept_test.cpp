// The speculation benchmark's stand-in acceptance: measured on golden files (a synthetic one with
// known matches, and the tiny fixtures whose random-weight drafter is never right) and the
// simulated accepted-prefix lengths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "../support/run_cli.h"
#include "bench/spec_accept.h"
#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::bench {
namespace {

TEST(SpecAccept, SyntheticGoldenFile) {
  // greedy: 10 11 12 13 14 15; drafts after steps 0..3 (anchor greedy[i+1], two drafts):
  //  row 0: anchor 11, drafts 12 (right) 99 (wrong)      -> tried 2, accepted 1
  //  row 1: anchor 12, drafts 13 (right) 14 (right)      -> tried 2, accepted 2
  //  row 2: anchor 13, drafts 77 (wrong) 15 (not tried)  -> tried 1, accepted 0
  //  row 3: anchor 14, drafts 15 (right) 16 (beyond greedy) -> tried 1, accepted 1
  const std::vector<int32_t> greedy = {10, 11, 12, 13, 14, 15};
  const std::vector<int32_t> drafts = {11, 12, 99, 12, 13, 14, 13, 77, 15, 14, 15, 16};
  const std::string path =
      (std::filesystem::temp_directory_path() / ("golden-" + std::to_string(::getpid()) + ".safetensors")).string();
  SafetensorsWriter w;
  w.add("greedy_ids", DType::I32, {6}, greedy);
  w.add("dspark_draft_ids", DType::I32, {4, 3}, drafts);
  w.write(path);
  const Acceptance a = measure_acceptance({path});
  EXPECT_EQ(a.rows, 4);
  EXPECT_EQ(a.tried, 6);
  EXPECT_EQ(a.accepted, 4);
  EXPECT_DOUBLE_EQ(a.rate(), 4.0 / 6.0);
  // twice the same file: twice the counts
  const Acceptance b = measure_acceptance({path, path});
  EXPECT_EQ(b.tried, 12);
  EXPECT_EQ(b.accepted, 8);
  // an anchor that is not the greedy token is a broken file
  std::vector<int32_t> bad = drafts;
  bad[3] = 50;
  SafetensorsWriter w2;
  w2.add("greedy_ids", DType::I32, {6}, greedy);
  w2.add("dspark_draft_ids", DType::I32, {4, 3}, bad);
  w2.write(path);
  EXPECT_THROW(measure_acceptance({path}), Error);
  std::filesystem::remove(path);
}

TEST(SpecAccept, TinyFixturesDraftsAreNeverRight) {
  const std::string dir = DSV41_FIXTURES_DIR;
  const Acceptance a = measure_acceptance({dir + "/tiny-s0/golden.safetensors", dir + "/tiny-long/golden.safetensors"});
  EXPECT_EQ(a.rows, 12 + 16);
  EXPECT_GT(a.tried, 0);
  EXPECT_EQ(a.accepted, 0);
}

TEST(SpecAccept, SimulatedPrefixLengths) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(simulate_accepted(0.0, 4, rng), 0);
    EXPECT_EQ(simulate_accepted(1.0, 4, rng), 4);
  }
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(simulate_accepted(0.5, 4, rng));
  EXPECT_NEAR(sum / n, 0.5 + 0.25 + 0.125 + 0.0625, 0.01);  // E = sum of rate^j, j = 1..k
}

TEST(SpecAccept, CliNeedsCuda) {
  const std::string fx = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0";
  const auto r = test::run_cli("bench decode --device cpu --model " + fx + "/model --engram-token-map " + fx +
                                   "/engram_token_map.safetensors --spec-tokens 2 --spec-accept 0.5",
                               test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--spec-tokens"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dsv41::bench
