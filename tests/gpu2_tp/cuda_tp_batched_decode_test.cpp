// Batched decode under tensor parallelism (label gpu2): rank 0 in this process (GPU 0) with a
// `--rank 1 --device cuda` worker process (GPU 1). The decode steps of several sequences handed to
// TpModel::forward together must run as one pass on every rank — as many all-reduces as one
// sequence's step, not one step's worth per sequence — and give each sequence exactly the logits
// it gets when stepped alone on the same two ranks, and the one-GPU engine's logits (greedy ids
// identical, within 1e-3 of the row's range; the split is exact, so bit for bit is expected).
// A prefill that joins a decode batch (a new sequence, created on the worker in the same plan)
// is covered too.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../support/process.h"
#include "dsv41/dist/tp_runtime.h"
#include "dsv41/model/cuda_model.h"

using namespace dsv41;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kFix = DSV41_FIXTURES_DIR;

// One sequence followed on three engines: two ranks stepped in batches (a), two ranks stepped
// alone (b), one GPU stepped alone (c).
struct Followed {
  std::unique_ptr<SeqState> a, b, c;
  std::vector<float> la, lb, lc;
};

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

ForwardItem item(SeqState& s, std::span<const int32_t> tokens, std::vector<float>& logits) {
  ForwardItem it;
  it.state = &s;
  it.tokens = tokens;
  it.logits = &logits;
  return it;
}

class CudaTpBatchedDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTpBatchedDecode, OnePassPerStepAndTheLogitsOfEachSequenceAlone) {
  const std::string name = GetParam();
  const std::string model = kFix + "/" + name + "/model", map = kFix + "/" + name + "/engram_token_map.safetensors";
  std::ifstream g(kFix + "/" + name + "/golden.json");
  const std::vector<int32_t> prompt = nlohmann::json::parse(g)["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 12u);
  const fs::path dir = fs::temp_directory_path() / ("dsv41_cuda_tp_batch_" + std::to_string(::getpid())) / name;
  fs::create_directories(dir);

  model::CudaModelOptions co;
  co.engram_token_map = map;
  co.dspark = false;
  co.device = 0;
  dist::TpHeadOptions ho;
  ho.world_size = 2;
  ho.master_port = test::free_port();
  ho.model_dir = model;
  ho.run.dspark = false;
  ho.exit_workers_on_close = true;
  // The worker takes GPU 1 (its rank modulo the visible devices) and retries until rank 0 listens.
  const pid_t worker = test::spawn_binary({"--rank", "1", "--world-size", "2", "--model", model, "--master-addr",
                                           "127.0.0.1", "--master-port", std::to_string(ho.master_port), "--device",
                                           "cuda", "--engram-token-map", map},
                                          dir / "worker.log");
  ASSERT_GT(worker, 0);
  std::unique_ptr<dist::TpModel> tp = dist::TpModel::start_cuda(ho, co);
  tp->wait_for_workers(120.0);
  std::unique_ptr<model::CudaModel> one = model::CudaModel::load(model, co);

  // Prompts of different lengths (different positions, list lengths and compressor phases).
  const std::vector<size_t> lengths = {prompt.size(), 5, prompt.size() - 3};
  std::vector<Followed> seqs;
  seqs.reserve(8);  // items point into it
  auto prefill = [&](size_t len) {
    Followed f;
    f.a = tp->new_sequence();
    f.b = tp->new_sequence();
    f.c = one->new_sequence();
    const std::span<const int32_t> p(prompt.data(), len);
    tp->forward_sequence(*f.b, p, false, &f.lb);
    one->forward_sequence(*f.c, p, false, &f.lc);
    return f;
  };
  for (size_t len : lengths) {
    seqs.push_back(prefill(len));
    std::vector<ForwardItem> it = {item(*seqs.back().a, std::span<const int32_t>(prompt.data(), len), seqs.back().la)};
    tp->forward(it);
  }

  auto check = [&](const Followed& f, const std::string& where) {
    ASSERT_EQ(f.la.size(), static_cast<size_t>(tp->config().vocab_size)) << where;
    ASSERT_EQ(f.lb.size(), f.la.size()) << where;
    ASSERT_EQ(f.lc.size(), f.la.size()) << where;
    EXPECT_EQ(std::memcmp(f.la.data(), f.lb.data(), f.la.size() * 4), 0)
        << where << ": batched logits differ from the sequence's step alone on the same ranks";
    const auto [lo, hi] = std::minmax_element(f.lc.begin(), f.lc.end());
    float worst = 0.0f;
    for (size_t i = 0; i < f.la.size(); ++i) worst = std::max(worst, std::fabs(f.la[i] - f.lc[i]));
    EXPECT_LE(worst, 1e-3f * (*hi - *lo)) << where << ": against one GPU";
    EXPECT_EQ(argmax(f.la), argmax(f.lc)) << where;
  };
  for (size_t i = 0; i < seqs.size(); ++i) check(seqs[i], "prefill " + std::to_string(i));

  constexpr int kSteps = 6, kJoinStep = 2;
  const size_t join_len = 9;
  auto calls = [&] { return tp->collective_stats().all_reduce_calls; };
  for (int step = 0; step < kSteps; ++step) {
    const std::string where = "step " + std::to_string(step);
    const size_t n_old = seqs.size();
    std::vector<int32_t> next(n_old);
    for (size_t i = 0; i < n_old; ++i) next[i] = argmax(seqs[i].la);
    // Two ranks, the steps together; at kJoinStep a new sequence's prompt among them (its
    // prefill alone on (b) and (c) first, counting the collectives of one prefill pass).
    std::vector<ForwardItem> batch;
    uint64_t join_calls = 0;
    for (size_t i = 0; i < n_old; ++i) {
      batch.push_back(item(*seqs[i].a, std::span<const int32_t>(&next[i], 1), seqs[i].la));
      if (step == kJoinStep && i == 0) {
        const uint64_t j0 = calls();
        seqs.push_back(prefill(join_len));
        join_calls = calls() - j0;
        batch.push_back(item(*seqs.back().a, std::span<const int32_t>(prompt.data(), join_len), seqs.back().la));
      }
    }
    const uint64_t r0 = calls();
    tp->forward(batch);
    const uint64_t batched = calls() - r0;
    // Two ranks, each sequence alone; one GPU.
    uint64_t alone_max = 0;
    for (size_t i = 0; i < n_old; ++i) {
      const uint64_t s0 = calls();
      tp->forward_sequence(*seqs[i].b, std::span<const int32_t>(&next[i], 1), false, &seqs[i].lb);
      const uint64_t alone = calls() - s0;
      EXPECT_GT(alone, 0u) << where;
      alone_max = std::max(alone_max, alone);
      one->forward_sequence(*seqs[i].c, std::span<const int32_t>(&next[i], 1), false, &seqs[i].lc);
    }
    // One pass for all the decode steps (and the joining prompt's own pass).
    EXPECT_EQ(batched, alone_max + join_calls)
        << where << ": " << n_old << " decode steps did not run as one pass (one step alone: " << alone_max
        << " all-reduces)";
    for (size_t i = 0; i < seqs.size(); ++i) check(seqs[i], where + ", sequence " + std::to_string(i));
  }
  for (const Followed& f : seqs) EXPECT_EQ(f.a->n_past, f.b->n_past);

  tp.reset();  // tells the worker to exit
  int st = 0;
  for (int i = 0; i < 200 && ::waitpid(worker, &st, WNOHANG) != worker; ++i) std::this_thread::sleep_for(50ms);
  if (::kill(worker, 0) == 0) {
    ::kill(worker, SIGKILL);
    ::waitpid(worker, &st, 0);
    ADD_FAILURE() << "the worker did not exit after rank 0 closed";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTpBatchedDecode, ::testing::Values("tiny-s0", "tiny-long"));

}  // namespace
