// The CUDA backend against the CPU reference engine (the numerical truth, src/model/): the same
// checkpoint, prompt, chunking and greedy decode must give the same argmax everywhere and logits
// within 1e-3 of each row's range (the ops are bit-exact in isolation; the bound leaves room for
// last-ulp libm differences only). Checkpoints: the tiny-long fixture (window wrap, hundreds of
// compressed entries, decode past the window) and random `mkmodel --format fp8` checkpoints of both
// fixture configs. Also: passes smaller than a chunk change nothing, and bad input gets one error.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../support/run_cli.h"
#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "model_check.h"

using namespace dsv41;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = DSV41_FIXTURES_DIR;
constexpr double kRelTol = 1e-3;

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

model::CudaModelOptions cuda_opts(const std::string& token_map, int64_t context, int64_t pass_tokens = 256,
                                  bool corrected = false) {
  model::CudaModelOptions o;
  o.corrected_index_keys = corrected;
  o.engram_token_map = token_map;
  o.max_context = context;
  o.max_chunk_tokens = pass_tokens;
  o.exact_block_sums = true;  // sequential block sums, no grouped MoE: compared with the CPU engine bit for bit
  return o;
}

void expect_same_run(const test::Run& gpu, const test::Run& cpu, int64_t V, const std::string& what) {
  EXPECT_EQ(test::argmax_mismatches(gpu.prefill, cpu.prefill, V), 0) << what << ": prefill argmax";
  const double pre = test::worst_rel(gpu.prefill, cpu.prefill, V);
  EXPECT_LE(pre, kRelTol) << what << ": prefill logits";
  EXPECT_EQ(gpu.greedy, cpu.greedy) << what << ": greedy ids";
  const double dec = test::worst_rel(gpu.decode, cpu.decode, V);
  if (gpu.greedy == cpu.greedy) EXPECT_LE(dec, kRelTol) << what << ": decode logits";
  std::cout << what << ": prefill rel err " << pre << " (bit-identical " << test::identical_fraction(gpu.prefill, cpu.prefill)
            << "), decode rel err " << dec << " (bit-identical " << test::identical_fraction(gpu.decode, cpu.decode)
            << ")\n";
}

// CPU and CUDA on one checkpoint folder, for each chunk size.
void compare_engines(const std::string& model_dir, const std::string& token_map, const std::vector<int32_t>& prompt,
                     int64_t decode, const std::vector<int64_t>& chunks, int64_t pass_tokens, const std::string& name,
                     bool corrected = false, int64_t mix_parts = 0) {
  model::CpuModelOptions co;
  co.engram_token_map = token_map;
  co.corrected_index_keys = corrected;
  co.mix_gemm_k_parts = mix_parts;
  co.dspark = false;
  auto cpu = model::CpuModel::load(model_dir, co);
  const int64_t context = static_cast<int64_t>(prompt.size()) + decode;
  model::CudaModelOptions go = cuda_opts(token_map, context, pass_tokens, corrected);
  go.mix_gemm_k_parts = mix_parts;
  auto gpu = model::CudaModel::load(model_dir, go);
  const int64_t V = cpu->config().vocab_size;
  for (int64_t chunk : chunks) {
    const auto t0 = std::chrono::steady_clock::now();
    const test::Run c = test::run_steps(*cpu, prompt, chunk, decode);
    const auto t1 = std::chrono::steady_clock::now();
    const test::Run g = test::run_steps(*gpu, prompt, chunk, decode);
    const auto t2 = std::chrono::steady_clock::now();
    std::cout << name << " chunk " << chunk << ": cpu " << std::chrono::duration<double>(t1 - t0).count() << " s, cuda "
              << std::chrono::duration<double>(t2 - t1).count() << " s for " << prompt.size() << " + " << decode
              << " tokens\n";
    expect_same_run(g, c, V, name + " chunk " + std::to_string(chunk) + " pass " + std::to_string(pass_tokens));
  }
}

// A random checkpoint of a fixture's config, with `edits` (keys of config.json) applied first.
std::string mkmodel(const std::string& fixture, uint64_t seed, const nlohmann::json& edits = nlohmann::json::object()) {
  const std::string tag = fixture + "_" + std::to_string(seed) + (edits.empty() ? "" : "_edited");
  const std::string dir = std::string(::testing::TempDir()) + "/dsv41_gpu_parity_" + tag;
  std::string config = kFixtures + "/" + fixture + "/model/config.json";
  if (!edits.empty()) {
    std::ifstream in(config);
    nlohmann::json j = nlohmann::json::parse(in);
    j.update(edits);
    config = std::string(::testing::TempDir()) + "/dsv41_gpu_parity_" + tag + ".json";
    std::ofstream(config) << j.dump(2);
  }
  fs::remove_all(dir);
  const auto r = test::run_cli(
      "mkmodel --config " + config + " --format fp8 --seed " + std::to_string(seed) + " --out " + dir,
      test::Stderr::kMerge);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return dir;
}

}  // namespace

TEST(GpuModelParity, TinyLongFixtureMatchesCpu) {
  const std::string dir = kFixtures + "/tiny-long";
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  const TensorInfo& p = *golden->find("prompt_ids");
  std::vector<int32_t> prompt(static_cast<size_t>(p.numel()));
  std::memcpy(prompt.data(), p.data, prompt.size() * 4);
  // Passes of 48 tokens split every chunk of 64 and the one-shot prompt into several passes.
  compare_engines(dir + "/model", dir + "/engram_token_map.safetensors", prompt, 40, {0, 64}, 48, "tiny-long");
  compare_engines(dir + "/model", dir + "/engram_token_map.safetensors", prompt, 8, {0}, 256, "tiny-long k_parts 3",
                  false, 3);
}

// The corrected decode reading (every indexer scores its own KV source's keys) matches the CPU too.
TEST(GpuModelParity, CorrectedIndexKeysMatchCpu) {
  const std::string dir = kFixtures + "/tiny-s0";
  compare_engines(dir + "/model", dir + "/engram_token_map.safetensors", random_prompt(30, 512, 9), 30, {0}, 256,
                  "tiny-s0 corrected keys", true);
}

TEST(GpuModelParity, RandomCheckpointsMatchCpu) {
  const struct {
    const char* fixture;
    uint64_t seed;
    int64_t prompt, decode;
  } cases[] = {{"tiny-s0", 11, 50, 20}, {"tiny-long", 23, 150, 30}};
  for (const auto& k : cases) {
    const std::string dir = mkmodel(k.fixture, k.seed);
    const std::string tm = kFixtures + "/" + k.fixture + "/engram_token_map.safetensors";
    const std::vector<int32_t> prompt = random_prompt(k.prompt, 512, static_cast<uint32_t>(k.seed));
    compare_engines(dir, tm, prompt, k.decode, {0, 9}, 256,
                    std::string("mkmodel ") + k.fixture + " seed " + std::to_string(k.seed));
  }
}

// The index top-k and candidate blocks on the device (gpu::topk_replay, candidate_blocks) select
// what the host selection does, ties included: logits bit for bit, one-shot and in chunks. The
// random checkpoints' bf16 index scores tie often.
TEST(GpuModelParity, DeviceIndexSelectionMatchesTheHost) {
  const struct {
    const char* fixture;
    int64_t prompt;  // + 30 decoded: within each config's max_position_embeddings
  } cases[] = {{"tiny-s0", 90}, {"tiny-long", 150}};
  for (const auto& [fixture, length] : cases) {
    const std::string dir = mkmodel(fixture, 31);
    const std::string tm = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
    const std::vector<int32_t> prompt = random_prompt(length, 512, 8);
    model::CudaModelOptions host = cuda_opts(tm, length + 30, 256), device = host;
    host.host_index_topk = true;
    auto a = model::CudaModel::load(dir, host);
    auto b = model::CudaModel::load(dir, device);
    for (int64_t chunk : {0, 13}) {
      const test::Run h = test::run_steps(*a, prompt, chunk, 30);
      const test::Run d = test::run_steps(*b, prompt, chunk, 30);
      const std::string what = std::string(fixture) + " chunk " + std::to_string(chunk);
      EXPECT_EQ(h.prefill, d.prefill) << what;
      EXPECT_EQ(h.decode, d.decode) << what;
      EXPECT_EQ(h.greedy, d.greedy) << what;
    }
  }
}

// The reference's other top-k branch (partial_sort's heap, k·64 <= columns) inside the model: a
// tiny-long checkpoint keeping 2 index entries and 1 candidate block, so rows of 128 columns and
// more (index) and 256 and more (candidates) take it, on the device in passes of 128 rows and more
// (Impl::kDeviceHeapRows), against the CPU engine and the host selection.
TEST(GpuModelParity, HeapBranchSelectionMatchesCpuAndHost) {
  const std::string tm = kFixtures + "/tiny-long/engram_token_map.safetensors";
  const std::string dir = mkmodel("tiny-long", 37, {{"index_topk", 2}, {"candidate_topk_blocks", 1}});
  const std::vector<int32_t> prompt = random_prompt(300, 512, 12);
  compare_engines(dir, tm, prompt, 30, {0, 150}, 256, "tiny-long heap branch");
  model::CudaModelOptions host = cuda_opts(tm, 340, 256), device = host;
  host.host_index_topk = true;
  auto a = model::CudaModel::load(dir, host);
  auto b = model::CudaModel::load(dir, device);
  const test::Run h = test::run_steps(*a, prompt, 0, 30);
  const test::Run d = test::run_steps(*b, prompt, 0, 30);
  EXPECT_EQ(h.prefill, d.prefill);
  EXPECT_EQ(h.decode, d.decode);
  EXPECT_EQ(h.greedy, d.greedy);
}

TEST(GpuModelParity, PassSizeDoesNotChangeResults) {
  const std::string dir = kFixtures + "/tiny-s0";
  const std::string tm = dir + "/engram_token_map.safetensors";
  const std::vector<int32_t> prompt = random_prompt(40, 512, 5);
  auto big = model::CudaModel::load(dir + "/model", cuda_opts(tm, 60, 256));
  auto small = model::CudaModel::load(dir + "/model", cuda_opts(tm, 60, 3));
  // logits of at most 7 rows per pass: the 40-row prompt with every row's logits runs as 6 passes
  model::CudaModelOptions few_rows = cuda_opts(tm, 60, 256);
  few_rows.max_logit_rows = 7;
  auto capped = model::CudaModel::load(dir + "/model", few_rows);
  const test::Run a = test::run_steps(*big, prompt, 0, 10);
  const test::Run b = test::run_steps(*small, prompt, 0, 10);
  const test::Run d = test::run_steps(*capped, prompt, 0, 10);
  EXPECT_EQ(a.prefill, b.prefill);
  EXPECT_EQ(a.decode, b.decode);
  EXPECT_EQ(a.greedy, b.greedy);
  EXPECT_EQ(a.prefill, d.prefill);
  EXPECT_EQ(a.decode, d.decode);
  EXPECT_EQ(a.greedy, d.greedy);
  // 256 logit rows against 7: not larger, though not always smaller, since the logits share memory
  // with the layers' buffers (dsv41/model/cuda_scratch_plan.h)
  EXPECT_GE(big->memory().scratch, capped->memory().scratch);
  const model::CudaMemoryBreakdown mem = big->memory();
  EXPECT_GT(mem.weights, 0);
  EXPECT_GT(mem.state_per_sequence, 0);
  EXPECT_GT(mem.scratch, small->memory().scratch);
  // The release format: FP8 linears, FP4 experts, no EXL3; the formats add up to the total.
  EXPECT_GT(mem.weights_fp8, 0);
  EXPECT_GT(mem.weights_fp4, 0);
  EXPECT_EQ(mem.weights_exl3, 0);
  EXPECT_EQ(mem.weights_fp8 + mem.weights_fp4 + mem.weights_exl3 + mem.weights_dense, mem.weights);
}

TEST(GpuModelParity, BadInputGetsOneClearError) {
  const std::string dir = kFixtures + "/tiny-s0";
  auto m = model::CudaModel::load(dir + "/model", cuda_opts(dir + "/engram_token_map.safetensors", 8));
  auto st = m->new_sequence();
  std::vector<float> lg;
  const std::vector<int32_t> bad = {1, 512};
  EXPECT_THROW(m->forward_sequence(*st, bad, false, &lg), Error);
  auto st2 = m->new_sequence();
  const std::vector<int32_t> long_prompt(9, 3);
  try {
    m->forward_sequence(*st2, long_prompt, false, &lg);
    ADD_FAILURE() << "a prompt beyond the sequence capacity was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::CudaModel::load(dir + "/no-such-model", cuda_opts("", 8)), Error);
}
