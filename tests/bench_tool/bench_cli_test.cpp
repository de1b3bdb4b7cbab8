// `dsv41-serve bench decode|prefill` on the CPU reference engine with the tiny fixture (a smoke test
// of the whole tool: rows, JSON, extrapolation), and its argument errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../support/run_cli.h"
#include "bench/model_bench.h"
#include "dsv41/common/error.h"

namespace dsv41::bench {
namespace {

const std::string kFix = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0";
const std::string kModelArgs =
    "--device cpu --model " + kFix + "/model --engram-token-map " + kFix + "/engram_token_map.safetensors";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".json")).string();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

TEST(BenchList, ParsesAndRejects) {
  EXPECT_EQ(parse_positive_list("1,2,4", "--batch"), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(parse_positive_list("131072", "--context"), (std::vector<int64_t>{131072}));
  for (const char* bad : {"", "1,,2", "1,2,", "0", "-1", "a", "1.5", "2 ,4", "99999999999999"}) {
    SCOPED_TRACE(bad);
    try {
      parse_positive_list(bad, "--batch");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--batch"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchCli, ArgumentErrors) {
  auto r = test::run_cli("bench frobnicate " + kModelArgs, test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("frobnicate"), std::string::npos) << r.out;
  r = test::run_cli("bench", test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  r = test::run_cli("bench decode " + kModelArgs + " --batch 1,x", test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--batch: 'x' is not a positive integer"), std::string::npos) << r.out;
  r = test::run_cli("bench prefill " + kModelArgs + " --tokens 0", test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--tokens"), std::string::npos) << r.out;
  // beyond the tiny model's 128 positions
  r = test::run_cli("bench decode " + kModelArgs + " --context 500 --steps 1 --warmup 0", test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("max_position_embeddings"), std::string::npos) << r.out;
  r = test::run_cli("bench decode " + kModelArgs + " --steps 0", test::Stderr::kMerge);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--steps"), std::string::npos) << r.out;
}

TEST(BenchCli, DecodeOnTinyCpu) {
  const std::string json = temp_path("bench-decode");
  const auto r = test::run_cli("bench decode " + kModelArgs +
                               " --batch 1,2 --context 8,40 --steps 2 --warmup 1 --layers-total 12 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("ms/layer/tok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("%roofline"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("extrapolated to 12 layers"), std::string::npos) << r.out;
  const nlohmann::json j = read_json(json);
  std::remove(json.c_str());
  ASSERT_EQ(j["rows"].size(), 4u);
  EXPECT_EQ(j["layers"], 6);
  const int64_t want[4][2] = {{1, 8}, {2, 8}, {1, 40}, {2, 40}};
  for (size_t i = 0; i < 4; ++i) {
    const auto& row = j["rows"][i];
    EXPECT_EQ(row["batch"], want[i][0]);
    EXPECT_EQ(row["context"], want[i][1]);
    EXPECT_GT(row["step_ms"].get<double>(), 0.0);
    EXPECT_GT(row["step_ms_no_head"].get<double>(), 0.0);
    EXPECT_GT(row["floor_ms"].get<double>(), 0.0);
    EXPECT_NEAR(row["tokens_per_s"].get<double>(), want[i][0] * 1e3 / row["step_ms"].get<double>(), 1e-6);
    EXPECT_EQ(row["full"]["layers"], 12);
    EXPECT_GT(row["full"]["tp2"]["node_bytes"].get<double>(), 0.0);
    // a larger context reads more state
    if (i >= 2)
      EXPECT_GT(row["floor_bytes"]["state"].get<double>(), j["rows"][i - 2]["floor_bytes"]["state"].get<double>());
    // printed as a table row: batch and context in the first two columns
    EXPECT_NE(r.out.find(fmt::format("{:>5} {:>8} ", want[i][0], want[i][1])), std::string::npos) << r.out;
  }
}

TEST(BenchCli, PrefillOnTinyCpu) {
  const std::string json = temp_path("bench-prefill");
  const auto r = test::run_cli("bench prefill " + kModelArgs + " --tokens 16,64 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("MoE GEMM rate vs dense bf16 peak 989 TFLOP/s"), std::string::npos) << r.out;
  const nlohmann::json j = read_json(json);
  std::remove(json.c_str());
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["tokens"], 16);
  EXPECT_EQ(j["rows"][1]["tokens"], 64);
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["seconds"].get<double>(), 0.0);
    // 2·N·(top_k + shared)·3·dim·inter per layer: tiny = 2·N·3·3·256·128·6
    EXPECT_DOUBLE_EQ(row["moe_flops"].get<double>(), 2.0 * row["tokens"].get<double>() * 3 * 3 * 256 * 128 * 6);
  }
}

}  // namespace
}  // namespace dsv41::bench
