// Decode steps in CUDA graphs (src/cuda_model/cuda_graph.h): with the graphs on, every decode
// step's logits must equal those of the same schedule run eagerly and the CPU engine's, bit for
// bit. The schedule makes the graphs' buckets change (sequences join with their prefill, which runs
// eagerly, and leave, so the batched passes go 2, 3, 4, ... rows and back) and their executables
// get refreshed each step (new positions, list lengths, score columns) and re-instantiated when a
// step's launches differ (rows whose top-k lengths split into other attention runs). Steps run
// batched and one sequence per call (the solo decode path), on tiny-s0, tiny-long and EXL3 models.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../support/mkmodel_variants.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "model_check.h"

using namespace dsv41;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = DSV41_FIXTURES_DIR;

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

// Sequence i: a prompt of prompt_len[i] tokens prefilled at step join[i], then decode steps until
// step leave[i] (exclusive).
struct Schedule {
  std::vector<int64_t> prompt_len, join, leave;
  uint32_t seed = 1;
};

// Every recorded logits row per sequence (its prefill's last row, then every decode step's).
using Logits = std::vector<std::vector<float>>;

Logits run(Model& m, const Schedule& s, bool together) {
  const int64_t V = m.config().vocab_size, n_seq = static_cast<int64_t>(s.prompt_len.size());
  int64_t steps = 0;
  for (int64_t l : s.leave) steps = std::max(steps, l);
  Logits out(static_cast<size_t>(n_seq));
  std::vector<std::unique_ptr<SeqState>> st(static_cast<size_t>(n_seq));
  std::vector<std::vector<int32_t>> prompt(static_cast<size_t>(n_seq)), feed(static_cast<size_t>(n_seq));
  for (int64_t i = 0; i < n_seq; ++i) {
    const auto u = static_cast<size_t>(i);
    prompt[u] = random_ids(s.prompt_len[u], V, s.seed + static_cast<uint32_t>(i) * 13);
    feed[u] = random_ids(s.leave[u] - s.join[u], V, s.seed + 500 + static_cast<uint32_t>(i));
  }
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<ForwardItem> items;
    std::vector<std::vector<float>> lg(static_cast<size_t>(n_seq));
    std::vector<size_t> owner;
    for (int64_t i = 0; i < n_seq; ++i) {
      const auto u = static_cast<size_t>(i);
      if (step < s.join[u] || step >= s.leave[u]) continue;
      ForwardItem it;
      if (step == s.join[u]) {
        st[u] = m.new_sequence();
        st[u]->prompt_len = s.prompt_len[u];
        it.tokens = prompt[u];
      } else {
        it.tokens = std::span<const int32_t>(&feed[u][static_cast<size_t>(step - s.join[u] - 1)], 1);
      }
      it.state = st[u].get();
      it.logits = &lg[u];
      items.push_back(it);
      owner.push_back(u);
    }
    if (together) m.forward(items);
    else
      for (ForwardItem& it : items) m.forward(std::span<ForwardItem>(&it, 1));
    for (size_t j = 0; j < items.size(); ++j) {
      EXPECT_EQ(static_cast<int64_t>(lg[owner[j]].size()), V);
      out[owner[j]].insert(out[owner[j]].end(), lg[owner[j]].begin(), lg[owner[j]].end());
    }
  }
  return out;
}

void expect_bits(const Logits& got, const Logits& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(want[i].empty()) << what << ": sequence " << i;
    const bool same = got[i].size() == want[i].size() &&
                      std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)) == 0;
    EXPECT_TRUE(same) << what << ": sequence " << i << " (bit-identical fraction "
                      << test::identical_fraction(got[i], want[i]) << ")";
  }
}

model::CudaModelOptions cuda_opts(const std::string& fixture, int64_t k_parts, bool graphs) {
  model::CudaModelOptions o;
  o.engram_token_map = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
  o.mix_gemm_k_parts = k_parts;
  o.dspark = false;
  o.grouped_moe_min_rows = 0;  // the exact per-pair MoE kernels
  o.cuda_graphs = graphs;
  return o;
}

// tiny-s0: window 16, top-k 8; batches of 2..5 rows as sequences join and leave.
Schedule s0_schedule() { return {{1, 6, 17, 30, 45}, {0, 0, 2, 3, 5}, {12, 7, 12, 10, 12}, 41}; }
// tiny-long: window 32, top-k 16, hundreds of compressed entries.
Schedule long_schedule() { return {{3, 33, 70, 150}, {0, 1, 0, 3}, {13, 13, 8, 11}, 77}; }

void check_fixture(const std::string& fixture, int64_t k_parts, const Schedule& s) {
  const std::string dir = kFixtures + "/" + fixture + "/model";
  auto graphs = model::CudaModel::load(dir, cuda_opts(fixture, k_parts, true));
  auto eager = model::CudaModel::load(dir, cuda_opts(fixture, k_parts, false));
  ASSERT_TRUE(graphs->cuda_graphs());
  ASSERT_FALSE(eager->cuda_graphs());
  model::CpuModelOptions co;
  co.engram_token_map = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
  co.mix_gemm_k_parts = k_parts;
  co.dspark = false;
  auto cpu = model::CpuModel::load(dir, co);
  const Logits want = run(*cpu, s, true);
  for (bool together : {true, false}) {
    const std::string what = fixture + (together ? " batched" : " solo");
    const model::CudaGraphStats g0 = graphs->graph_stats();
    const Logits g = run(*graphs, s, together);
    const Logits e = run(*eager, s, together);
    expect_bits(g, e, what + " graphs vs eager");
    expect_bits(g, want, what + " graphs vs cpu");
    const model::CudaGraphStats g1 = graphs->graph_stats();
    const int64_t launches = g1.graph_launches - g0.graph_launches, inst = g1.instantiations - g0.instantiations;
    const int64_t upd = g1.updates - g0.updates;
    std::cout << what << ": " << launches << " graph launches, " << upd << " updates, " << inst
              << " instantiations\n";
    EXPECT_GT(launches, 0) << what;
    EXPECT_GT(upd, 0) << what << ": no executable was reused";
    EXPECT_GT(inst, 0) << what;
    EXPECT_EQ(launches, upd + inst) << what << ": every launch runs a refreshed or a new executable";
    EXPECT_EQ(eager->graph_stats().graph_launches, 0) << what << ": the eager model launched graphs";
  }
}

}  // namespace

TEST(GpuCudaGraphs, TinyS0GraphsMatchEagerAndCpu) { check_fixture("tiny-s0", 0, s0_schedule()); }

TEST(GpuCudaGraphs, TinyLongGraphsMatchEagerAndCpu) { check_fixture("tiny-long", 3, long_schedule()); }

// Graphs switched off and on at run time on one model (as `bench decode` does) change nothing.
TEST(GpuCudaGraphs, SwitchingGraphsMidSequenceKeepsResults) {
  const std::string dir = kFixtures + "/tiny-s0/model";
  auto m = model::CudaModel::load(dir, cuda_opts("tiny-s0", 0, true));
  auto ref = model::CudaModel::load(dir, cuda_opts("tiny-s0", 0, false));
  const std::vector<int32_t> prompt = random_ids(20, m->config().vocab_size, 5);
  auto a = m->new_sequence(), b = ref->new_sequence();
  a->prompt_len = b->prompt_len = static_cast<int64_t>(prompt.size());
  std::vector<float> la, lb;
  m->forward_sequence(*a, prompt, false, &la);
  ref->forward_sequence(*b, prompt, false, &lb);
  for (int step = 0; step < 8; ++step) {
    m->set_cuda_graphs(step % 3 != 1);
    const int32_t tok = test::argmax_row(lb.data(), static_cast<int64_t>(lb.size()));
    m->forward_sequence(*a, std::span<const int32_t>(&tok, 1), false, &la);
    ref->forward_sequence(*b, std::span<const int32_t>(&tok, 1), false, &lb);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0) << "step " << step;
  }
  EXPECT_GT(m->graph_stats().graph_launches, 0);
}

// DSV41_NO_GRAPHS=1 turns the graphs off whatever the options say.
TEST(GpuCudaGraphs, EnvironmentTurnsGraphsOff) {
  ::setenv("DSV41_NO_GRAPHS", "1", 1);
  auto m = model::CudaModel::load(kFixtures + "/tiny-s0/model", cuda_opts("tiny-s0", 0, true));
  ::unsetenv("DSV41_NO_GRAPHS");
  EXPECT_FALSE(m->cuda_graphs());
  auto on = model::CudaModel::load(kFixtures + "/tiny-s0/model", cuda_opts("tiny-s0", 0, true));
  EXPECT_TRUE(on->cuda_graphs());
  const model::CudaMemoryBreakdown mem = on->memory();
  EXPECT_GT(mem.engram_staging, 0);
  EXPECT_LE(mem.engram_staging, mem.scratch);
  EXPECT_GT(mem.pinned_host, 0);
}

// EXL3 checkpoints (MUL1: int8 path; MCG: f16 path): graphs vs eager, batched and solo, bit for bit.
TEST(GpuCudaGraphs, Exl3GraphsMatchEager) {
  for (const test::MkmodelVariant& v : test::mkmodel_exl3_variants()) {
    if (v.name != "exl3_mul1_b3" && v.name != "exl3_mcg_b2_5") continue;
    const std::string dir = std::string(::testing::TempDir()) + "/dsv41_gpu_graphs_" + v.name;
    fs::remove_all(dir);
    const auto made = test::run_mkmodel(kFixtures, v, dir);
    ASSERT_EQ(made.exit_code, 0) << made.out;
    auto graphs = model::CudaModel::load(dir, cuda_opts(v.fixture, 0, true));
    auto eager = model::CudaModel::load(dir, cuda_opts(v.fixture, 0, false));
    const Schedule s = v.fixture == "tiny-s0" ? s0_schedule() : long_schedule();
    for (bool together : {true, false})
      expect_bits(run(*graphs, s, together), run(*eager, s, together), v.name + (together ? " batched" : " solo"));
    EXPECT_GT(graphs->graph_stats().graph_launches, 0) << v.name;
    fs::remove_all(dir);
  }
}
