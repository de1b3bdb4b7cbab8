// `dsv41-serve logits --device cuda` on tiny-s0 against DeepSeek's reference outputs, with the
// acceptance of the CPU engine's golden tests (tests/model/golden_check.h): greedy ids identical,
// argmax identical at every prefill position, logits within 1e-2 of the golden row range — one
// shot and with the prompt prefilled in chunks of 7 and 64.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../support/run_cli.h"
#include "dsv41/loader/safetensors.h"
#include "model_check.h"

using namespace dsv41;

namespace {

const std::string kFix = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0";

std::string tmp(const std::string& name) { return std::string(::testing::TempDir()) + "/dsv41_gpu_logits_" + name; }

std::vector<int32_t> i32(const TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

void check_cli(int64_t chunk) {
  auto golden = SafetensorsFile::open(kFix + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*golden->find("prompt_ids"));
  const std::vector<int32_t> want_greedy = i32(*golden->find("greedy_ids"));
  const std::vector<float> want_prefill = tensor_to_f32(*golden->find("prefill_logits"));
  const std::vector<float> want_decode = tensor_to_f32(*golden->find("decode_logits"));
  const int64_t V = golden->find("prefill_logits")->shape[1], N = static_cast<int64_t>(want_greedy.size()) - 1;

  const std::string ids = tmp("prompt" + std::to_string(chunk) + ".json");
  std::ofstream(ids) << nlohmann::json(prompt).dump();
  const std::string out = tmp("out" + std::to_string(chunk) + ".safetensors");
  std::filesystem::remove(out);
  std::string args = "logits --device cuda --model " + kFix + "/model --engram-token-map " + kFix +
                     "/engram_token_map.safetensors --prompt-ids " + ids + " --decode " + std::to_string(N) +
                     " --out " + out;
  if (chunk > 0) args += " --prefill-chunk " + std::to_string(chunk);
  const auto r = test::run_cli(args, test::Stderr::kMerge);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("weights"), std::string::npos) << "no memory breakdown printed:\n" << r.out;

  auto got = SafetensorsFile::open(out);
  const std::vector<float> prefill = tensor_to_f32(*got->find("prefill_logits"));
  const std::vector<float> decode = tensor_to_f32(*got->find("decode_logits"));
  const std::vector<int32_t> greedy = i32(*got->find("greedy_ids"));
  ASSERT_EQ(prefill.size(), want_prefill.size());
  EXPECT_EQ(test::argmax_mismatches(prefill, want_prefill, V), 0) << "prefill argmax mismatches";
  const double pre_err = test::worst_rel(prefill, want_prefill, V);
  EXPECT_LE(pre_err, 1e-2) << "prefill logits";
  EXPECT_EQ(greedy, want_greedy);
  if (greedy == want_greedy) EXPECT_LE(test::worst_rel(decode, want_decode, V), 1e-2) << "decode logits";
  std::cout << "tiny-s0 cuda chunk " << chunk << ": prefill rel err " << pre_err << "\n";
}

}  // namespace

TEST(GpuModelGolden, TinyS0OneShot) { check_cli(0); }
TEST(GpuModelGolden, TinyS0Chunks7) { check_cli(7); }
TEST(GpuModelGolden, TinyS0Chunks64) { check_cli(64); }

