// The CLI contracts: `tokenize`, `render` and `engram-map` of the dsv41-serve binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "dsv41/loader/safetensors.h"
#include "text_test_util.h"

namespace dsv41::text {
namespace {

using J = nlohmann::ordered_json;

struct RunResult {
  int status;
  std::string out;
};

// Runs the binary with `args`, feeding `input` on stdin; returns exit status and stdout.
RunResult run_cli(const std::string& args, const std::string& input) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string in_path = (dir / ("dsv41_text_cli_in_" + std::to_string(::getpid()))).string();
  std::ofstream(in_path, std::ios::binary) << input;
  const std::string cmd = std::string("\"") + DSV41_BINARY + "\" " + args + " < \"" + in_path + "\" 2>/dev/null";
  RunResult r{-1, ""};
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    r.status = ::pclose(p);
  }
  std::filesystem::remove(in_path);
  return r;
}

std::string tokenizer_arg() { return "--tokenizer \"" + testing::fixture_path("tokenizer/deepseek_v3_tokenizer.json") + "\""; }

TEST(TextCli, TokenizeMatchesGolden) {
  const auto golden = testing::read_json("tokenizer/tokenizer_golden.json");
  J texts = J::array(), want = J::array();
  for (const auto& c : golden["cases"]) {
    texts.push_back(c["text"]);
    want.push_back(c["ids"]);
  }
  const auto r = run_cli("tokenize " + tokenizer_arg(), texts.dump());
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(J::parse(r.out), want);
  EXPECT_NE(run_cli("tokenize " + tokenizer_arg(), "{\"not\": \"an array\"}").status, 0);
}

TEST(TextCli, RenderMatchesGolden) {
  const auto golden = testing::read_json("chat/chat_golden.json");
  const auto r = run_cli("render", golden.dump());
  ASSERT_EQ(r.status, 0);
  const auto out = J::parse(r.out);
  ASSERT_EQ(out.size(), golden.size());
  for (size_t i = 0; i < golden.size(); ++i) {
    if (golden[i].contains("error") && !golden[i]["error"].is_null()) {
      EXPECT_EQ(out[i].value("error", std::string()), golden[i]["error"].get<std::string>()) << i;
      EXPECT_FALSE(out[i].contains("prompt"));
    } else {
      EXPECT_EQ(out[i].value("prompt", std::string()), golden[i]["prompt"].get<std::string>()) << i;
    }
  }
}

TEST(TextCli, EngramMapJsonAndSafetensors) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string json_out = (dir / ("dsv41_engram_" + std::to_string(::getpid()) + ".json")).string();
  const std::string st_out = (dir / ("dsv41_engram_" + std::to_string(::getpid()) + ".safetensors")).string();
  ASSERT_EQ(run_cli("engram-map " + tokenizer_arg() + " --out \"" + json_out + "\"", "").status, 0);
  const auto got = J::parse(testing::read_file(json_out));
  const auto want = testing::read_json("tokenizer/engram_token_map_v3.json");
  EXPECT_EQ(got["compressed_vocab_size"], want["compressed_vocab_size"]);
  EXPECT_EQ(got["token_map"], want["token_map"]);
  ASSERT_EQ(run_cli("engram-map " + tokenizer_arg() + " --out \"" + st_out + "\"", "").status, 0);
  const auto st = SafetensorsFile::open(st_out);
  const TensorInfo* t = st->find("token_map");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::I32);
  ASSERT_EQ(t->numel(), static_cast<int64_t>(want["token_map"].size()));
  const auto* v = reinterpret_cast<const int32_t*>(t->data);
  for (size_t i = 0; i < want["token_map"].size(); i += 997) EXPECT_EQ(v[i], want["token_map"][i].get<int32_t>());
  EXPECT_EQ(st->metadata().at("compressed_vocab_size"), "98627");
  std::filesystem::remove(json_out);
  std::filesystem::remove(st_out);
}

}  // namespace
}  // namespace dsv41::text
