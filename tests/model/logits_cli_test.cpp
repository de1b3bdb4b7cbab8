// The `dsv41-serve logits` contract: output tensor names/shapes, the golden greedy ids through the
// CLI, and one clear error for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "dsv41/loader/safetensors.h"

using namespace dsv41;

namespace {

const std::string kFix = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0";

std::string tmp_path(const std::string& name) {
  return std::string(::testing::TempDir()) + "/dsv41_logits_" + name;
}

std::string write_ids(const std::string& name, const nlohmann::json& ids) {
  const std::string p = tmp_path(name);
  std::ofstream(p) << ids.dump();
  return p;
}

// Runs the binary; returns the exit status and fills `err` with stderr.
int run(const std::string& args, std::string& err) {
  const std::string errf = tmp_path("stderr.txt");
  const std::string cmd = std::string(DSV41_BINARY) + " logits " + args + " 2> " + errf + " > /dev/null";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(errf);
  err.assign(std::istreambuf_iterator<char>(f), {});
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

nlohmann::json golden_json() {
  std::ifstream f(kFix + "/golden.json");
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(LogitsCli, WritesGoldenTensorsWithDspark) {
  const auto gj = golden_json();
  const std::string ids = write_ids("prompt.json", gj["prompt_ids"]);
  const std::string out = tmp_path("out.safetensors");
  const int64_t N = static_cast<int64_t>(gj["greedy_ids"].size()) - 1;
  std::string err;
  ASSERT_EQ(run("--model " + kFix + "/model --prompt-ids " + ids + " --decode " + std::to_string(N) +
                    " --dspark --engram-token-map " + kFix + "/engram_token_map.safetensors --device cpu" +
                    " --prefill-chunk 7 --dump-blocks --out " + out,
                err),
            0)
      << err;
  auto f = SafetensorsFile::open(out);
  const int64_t S = static_cast<int64_t>(gj["prompt_ids"].size());
  EXPECT_EQ(f->find("prefill_logits")->shape, (std::vector<int64_t>{S, 512}));
  EXPECT_EQ(f->find("decode_logits")->shape, (std::vector<int64_t>{N, 512}));
  EXPECT_EQ(f->find("dspark_draft_ids")->shape, (std::vector<int64_t>{N, 3}));
  EXPECT_EQ(f->find("dspark_draft_logits")->shape, (std::vector<int64_t>{N, 2, 512}));
  EXPECT_EQ(f->find("dspark_confidence")->shape, (std::vector<int64_t>{N, 2}));
  ASSERT_NE(f->find("prefill_block5_h"), nullptr);
  EXPECT_EQ(f->find("prefill_block5_h")->shape, (std::vector<int64_t>{S, 4, 256}));
  const TensorInfo* g = f->find("greedy_ids");
  ASSERT_EQ(g->dtype, DType::I32);
  std::vector<int32_t> greedy(static_cast<size_t>(g->numel()));
  std::memcpy(greedy.data(), g->data, greedy.size() * 4);
  EXPECT_EQ(greedy, gj["greedy_ids"].get<std::vector<int32_t>>());
}

TEST(LogitsCli, BadInputGivesOneClearError) {
  const std::string base = "--model " + kFix + "/model --engram-token-map " + kFix +
                           "/engram_token_map.safetensors --out " + tmp_path("bad.safetensors");
  std::string err;
  EXPECT_EQ(run(base + " --prompt-ids " + write_ids("oob.json", {1, 2, 512}) + " --decode 1", err), 1);
  EXPECT_NE(err.find("outside the vocabulary"), std::string::npos) << err;
  EXPECT_EQ(run(base + " --prompt-ids " + write_ids("long.json", nlohmann::json::array({1, 2, 3})) +
                    " --decode 126",
                err),
            1);
  EXPECT_NE(err.find("max_position_embeddings"), std::string::npos) << err;
  EXPECT_EQ(run("--model " + kFix + "/model --out " + tmp_path("x.safetensors") + " --prompt-ids " +
                    write_ids("ok.json", {1, 2}) + " --decode 1",
                err),
            1);
  EXPECT_NE(err.find("--engram-token-map"), std::string::npos) << err;
  EXPECT_EQ(run(base + " --prompt-ids " + write_ids("notjson.json", "x") + " --decode 1", err), 1);
  EXPECT_NE(err.find("JSON array"), std::string::npos) << err;
}
