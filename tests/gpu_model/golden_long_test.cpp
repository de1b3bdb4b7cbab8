// tiny-long through the CUDA backend against DeepSeek's reference outputs with the engine's
// defaults (its 300-token prefill takes the blocked K order of the mixes GEMM, as in
// tests/model/golden_tiny_long_test.cpp): greedy ids identical, argmax identical at every prefill
// position, logits within 1e-2 of the golden row range; one shot and in chunks of 7 and 64.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cuda_model.h"
#include "model_check.h"

using namespace dsv41;

namespace {

const std::string kDir = std::string(DSV41_FIXTURES_DIR) + "/tiny-long";

std::vector<int32_t> i32(const TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

void check_long(int64_t chunk) {
  auto golden = SafetensorsFile::open(kDir + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*golden->find("prompt_ids"));
  const std::vector<int32_t> want_greedy = i32(*golden->find("greedy_ids"));
  const std::vector<float> want_prefill = tensor_to_f32(*golden->find("prefill_logits"));
  const std::vector<float> want_decode = tensor_to_f32(*golden->find("decode_logits"));
  const int64_t V = golden->find("prefill_logits")->shape[1], N = static_cast<int64_t>(want_greedy.size()) - 1;
  model::CudaModelOptions o;
  o.engram_token_map = kDir + "/engram_token_map.safetensors";
  o.max_context = static_cast<int64_t>(prompt.size()) + N;
  auto m = model::CudaModel::load(kDir + "/model", o);
  const test::Run r = test::run_steps(*m, prompt, chunk, N);
  EXPECT_EQ(test::argmax_mismatches(r.prefill, want_prefill, V), 0) << "prefill argmax mismatches";
  const double pre_err = test::worst_rel(r.prefill, want_prefill, V);
  EXPECT_LE(pre_err, 1e-2) << "prefill logits";
  EXPECT_EQ(r.greedy, want_greedy);
  if (r.greedy == want_greedy) EXPECT_LE(test::worst_rel(r.decode, want_decode, V), 1e-2) << "decode logits";
  std::cout << "tiny-long cuda chunk " << chunk << ": prefill rel err " << pre_err << "\n";
}

}  // namespace

TEST(GpuModelGolden, TinyLongOneShot) { check_long(0); }
TEST(GpuModelGolden, TinyLongChunks7) { check_long(7); }
TEST(GpuModelGolden, TinyLongChunks64) { check_long(64); }
