// The `dsv41-serve generate` contract: one JSON object {"ids", "accepted", "steps"} on stdout;
// greedy ids equal the fixture's greedy_ids with and without speculation; seeded sampling is
// reproducible; one clear error for --device cuda and bad values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/run_cli.h"

using namespace dsv41;

namespace {

const std::string kFix = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0";

nlohmann::json golden_json() {
  std::ifstream f(kFix + "/golden.json");
  return nlohmann::json::parse(f);
}

std::string prompt_file() {
  const std::string p = std::string(::testing::TempDir()) + "/dsv41_generate_prompt_" + std::to_string(::getpid()) + ".json";
  std::ofstream(p) << golden_json()["prompt_ids"].dump();
  return p;
}

std::string base_args(int64_t n) {
  return "generate --model " + kFix + "/model --prompt-ids " + prompt_file() + " --max-tokens " + std::to_string(n) +
         " --engram-token-map " + kFix + "/engram_token_map.safetensors";
}

nlohmann::json run_json(const std::string& args) {
  const auto r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << args;
  nlohmann::json j;
  EXPECT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  return j;
}

void check_shape(const nlohmann::json& j, int64_t n) {
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j.size(), 3u) << j.dump();
  ASSERT_TRUE(j["ids"].is_array());
  ASSERT_TRUE(j["accepted"].is_array());
  ASSERT_TRUE(j["steps"].is_number_integer());
  // n tokens, or fewer ending with the model's EOS (id 1 in the tiny config), which ends generation.
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_LE(static_cast<int64_t>(ids.size()), n);
  if (static_cast<int64_t>(ids.size()) < n) EXPECT_EQ(ids.back(), 1);
  EXPECT_EQ(j["steps"].get<int64_t>(), static_cast<int64_t>(j["accepted"].size()));
  int64_t total = 0;
  for (const auto& a : j["accepted"]) {
    EXPECT_GE(a.get<int64_t>(), 1);
    total += a.get<int64_t>();
  }
  EXPECT_EQ(total, static_cast<int64_t>(ids.size()));
}

}  // namespace

TEST(GenerateCli, GreedyIdsWithAndWithoutSpeculation) {
  const auto greedy = golden_json()["greedy_ids"].get<std::vector<int32_t>>();
  const int64_t n = static_cast<int64_t>(greedy.size());
  const auto off = run_json(base_args(n) + " --spec-method none --device cpu --world-size 1");
  check_shape(off, n);
  EXPECT_EQ(off["ids"].get<std::vector<int32_t>>(), greedy);
  EXPECT_EQ(off["steps"].get<int64_t>(), n);  // one token per step without speculation
  for (int k = 1; k <= 4; ++k) {
    const auto on = run_json(base_args(n) + " --spec-method dspark --spec-tokens " + std::to_string(k) +
                             " --spec-fixed-tokens --temperature 0");
    check_shape(on, n);
    EXPECT_EQ(on["ids"].get<std::vector<int32_t>>(), greedy) << "k = " << k;
  }
  // Text layout of the contract: one line holding one object, keys in contract order.
  const auto r = test::run_cli(base_args(3) + " --spec-method dspark");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("{\"ids\":", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1);
}

TEST(GenerateCli, SeededSamplingIsReproducible) {
  const std::string args = base_args(10) + " --spec-method dspark --temperature 0.8 --seed ";
  const auto a = run_json(args + "11"), b = run_json(args + "11"), c = run_json(args + "12");
  check_shape(a, 10);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["accepted"], b["accepted"]);
  EXPECT_NE(a["ids"], c["ids"]);
}

TEST(GenerateCli, ClearErrors) {
  auto err = [](const std::string& args) {
    const auto r = test::run_cli(args, test::Stderr::kMerge);
    EXPECT_EQ(r.exit_code, 1) << args;
    return r.out;
  };
  EXPECT_NE(err(base_args(4) + " --device cuda").find("--device cuda"), std::string::npos);
  EXPECT_NE(err(base_args(4) + " --spec-method medusa").find("--spec-method medusa"), std::string::npos);
  EXPECT_NE(err(base_args(0)).find("--max-tokens"), std::string::npos);
  EXPECT_NE(err(base_args(500)).find("max_position_embeddings"), std::string::npos);
  EXPECT_NE(err(base_args(4) + " --temperature -1").find("--temperature"), std::string::npos);
}
