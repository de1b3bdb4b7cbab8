// The CUDA backend with the grouped tensor-core MoE on every prefill pass (grouped_moe_min_rows = 1:
// one-shot prefill, chunks of 7 and 64; decode steps always keep the exact kernels) against
// DeepSeek's reference outputs,
// with the acceptance of the CPU engine's golden tests (tests/model/golden_check.h): greedy ids
// identical, argmax identical at every prefill position, logits within 1e-2 of the golden row range.
// tiny-long runs with the fixture's 3-part mixes GEMM (as golden_long_test.cpp). The path is not
// bit-identical to the exact per-pair kernels, so the distance to the exact path is printed too.
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

const std::string kFixtures = DSV41_FIXTURES_DIR;

std::vector<int32_t> i32(const TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

model::CudaModelOptions options(const std::string& fixture, int64_t context, int64_t min_rows) {
  model::CudaModelOptions o;
  o.engram_token_map = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
  o.max_context = context;
  o.mix_gemm_k_parts = fixture == "tiny-long" ? 3 : 0;
  o.grouped_moe_min_rows = min_rows;
  return o;
}

void check_fixture(const std::string& fixture, const std::vector<int64_t>& chunks) {
  const std::string dir = kFixtures + "/" + fixture;
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*golden->find("prompt_ids"));
  const std::vector<int32_t> want_greedy = i32(*golden->find("greedy_ids"));
  const std::vector<float> want_prefill = tensor_to_f32(*golden->find("prefill_logits"));
  const std::vector<float> want_decode = tensor_to_f32(*golden->find("decode_logits"));
  const int64_t V = golden->find("prefill_logits")->shape[1], N = static_cast<int64_t>(want_greedy.size()) - 1;
  const int64_t context = static_cast<int64_t>(prompt.size()) + N;
  auto grouped = model::CudaModel::load(dir + "/model", options(fixture, context, 1));
  auto exact = model::CudaModel::load(dir + "/model", options(fixture, context, 0));
  for (int64_t chunk : chunks) {
    const std::string what = fixture + " grouped MoE chunk " + std::to_string(chunk);
    SCOPED_TRACE(what);
    const test::Run r = test::run_steps(*grouped, prompt, chunk, N);
    EXPECT_EQ(test::argmax_mismatches(r.prefill, want_prefill, V), 0) << "prefill argmax mismatches";
    const double pre = test::worst_rel(r.prefill, want_prefill, V);
    EXPECT_LE(pre, 1e-2) << "prefill logits";
    EXPECT_EQ(r.greedy, want_greedy) << "greedy ids";
    double dec = -1;
    if (r.greedy == want_greedy) {
      dec = test::worst_rel(r.decode, want_decode, V);
      EXPECT_LE(dec, 1e-2) << "decode logits";
    }
    // The exact path on the same steps (its own greedy ids fed back): how far grouping moves things.
    const test::Run x = test::run_steps(*exact, prompt, chunk, N, &r.greedy);
    std::cout << what << ": vs golden prefill " << pre << " decode " << dec << "; vs exact path prefill "
              << test::worst_rel(r.prefill, x.prefill, V) << " (bit-identical " << test::identical_fraction(r.prefill, x.prefill)
              << "), decode " << test::worst_rel(r.decode, x.decode, V) << "\n";
  }
}

}  // namespace

TEST(GpuGroupedMoe, TinyS0MatchesGolden) { check_fixture("tiny-s0", {0, 7, 64}); }
TEST(GpuGroupedMoe, TinyLongMatchesGolden) { check_fixture("tiny-long", {0, 7, 64}); }
