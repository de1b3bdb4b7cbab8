// `dsv41-serve inspect` end to end: runs the built binary and parses its JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "loader_test_util.h"
#include "../support/run_cli.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;
using test::RawFile;
using test::TempDir;

using ::dsv41::test::CliResult;
using ::dsv41::test::run_cli;

TEST(InspectCli, JsonOnTheTinyFixture) {
  TempDir dir;
  test::copy_fixture_model("tiny-s0", dir.path());
  const CliResult r = run_cli("inspect --json --world-size 2 --model " + dir.str());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["n_tensors"].get<uint64_t>(), 411u);
  EXPECT_EQ(j["total_bytes"].get<uint64_t>(), test::read_bytes(dir.path() / "model.safetensors").size() -
                                                  8 - RawFile::read(dir.path() / "model.safetensors").header.size());
  EXPECT_TRUE(j["problems"].is_array());
  EXPECT_TRUE(j["problems"].empty()) << j["problems"].dump(2);
  EXPECT_EQ(j["expected"]["n_tensors"], j["n_tensors"]);
  // 6 layers x 4 experts x (w1, w2, w3) x (weight, scale); the DSpark stage counts as dspark
  EXPECT_EQ(j["components"]["routed_experts"]["tensors"].get<int>(), 6 * 4 * 6);
  ASSERT_EQ(j["per_rank"]["ranks"].size(), 2u);
  // routed experts split: each rank holds half of them
  EXPECT_EQ(j["per_rank"]["ranks"][0]["by_component"]["routed_experts"].get<uint64_t>() * 2,
            j["components"]["routed_experts"]["bytes"].get<uint64_t>());
}

TEST(InspectCli, ConfigOnlyReproducesTheReleasedIndex) {
  const CliResult r = run_cli(std::string("inspect --json --config-only ") + DSV41_SOURCE_DIR + "/configs/deepseek-v4.1-flash.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["n_tensors"].get<uint64_t>(), 96085u);
  EXPECT_EQ(j["total_bytes"].get<uint64_t>(), 510286023000u);
  EXPECT_TRUE(j["problems"].empty());
  const CliResult text = run_cli(std::string("inspect --config-only ") + DSV41_SOURCE_DIR + "/configs/deepseek-v4.1-flash.json");
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("96085 tensors, 510286023000 bytes"), std::string::npos) << text.out;
}

TEST(InspectCli, ExitCodeOneWithEveryProblem) {
  TempDir dir;
  test::copy_fixture_model("tiny-long", dir.path());
  RawFile f = RawFile::read(dir.path() / "model.safetensors");
  json h = f.json();
  h.erase("mtp.0.norm.weight");
  h["layers.0.attn.wkv.weight"]["dtype"] = "I8";
  f.set_json(h);
  f.write(dir.path() / "model.safetensors");
  const CliResult r = run_cli("inspect --json --model " + dir.str());
  EXPECT_EQ(r.exit_code, 1);
  const json j = json::parse(r.out);
  ASSERT_EQ(j["problems"].size(), 2u) << j["problems"].dump(2);
  EXPECT_EQ(j["n_tensors"].get<uint64_t>(), 410u);
  // text mode prints the same problems and the same exit code
  const CliResult t = run_cli("inspect --model " + dir.str());
  EXPECT_EQ(t.exit_code, 1);
  EXPECT_NE(t.out.find("missing tensor 'mtp.0.norm.weight'"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("dtype I8, expected F8_E4M3"), std::string::npos) << t.out;
}

TEST(InspectCli, BrokenShardAndBadConfigAreReportedNotFatal) {
  TempDir dir;
  test::copy_fixture_model("tiny-s0", dir.path());
  auto b = test::read_bytes(dir.path() / "model.safetensors");
  b.resize(b.size() / 2);
  test::write_bytes(dir.path() / "model.safetensors", b);
  json cfg = json::parse(std::ifstream(dir.path() / "config.json"));
  cfg["text_config"]["o_groups"] = 3;
  std::ofstream(dir.path() / "config.json") << cfg.dump();
  const CliResult r = run_cli("inspect --json --model " + dir.str());
  EXPECT_EQ(r.exit_code, 1);
  const json j = json::parse(r.out);
  std::string all = j["problems"].dump();
  EXPECT_NE(all.find("o_groups = 3"), std::string::npos) << all;
  EXPECT_NE(all.find("truncated"), std::string::npos) << all;
}

TEST(InspectCli, BadArgumentsGiveOneErrorAndNoReport) {
  TempDir dir;
  const std::string cfg = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model/config.json";
  for (const std::string& args : std::vector<std::string>{
           "inspect --model " + dir.str() + "/absent", "inspect --json --config-only " + dir.str() + "/absent.json",
        "inspect --json", "inspect --model " + dir.str() + " --config-only " + cfg,
        "inspect --format exl3 --model " + std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model",
        "inspect --world-size 0 --config-only " + cfg}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  }
}

TEST(InspectCli, Exl3FormatManifestHasBitWidths) {
  const CliResult r = run_cli(std::string("inspect --json --format exl3 --config-only ") + DSV41_FIXTURES_DIR +
                    "/tiny-s0/model/config.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_GT(j["exl3"]["linears"].get<int>(), 0);
  EXPECT_DOUBLE_EQ(j["exl3"]["k_histogram"]["6"].get<double>(), 1.0);  // the head at head_bits 6
  EXPECT_GT(j["exl3"]["bits_per_weight"].get<double>(), 3.0);           // K=3 plus suh/svh
}

}  // namespace
}  // namespace dsv41
