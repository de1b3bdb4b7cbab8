// Tensor parallelism on the CUDA backend across two processes with one GPU each (NCCL; label gpu2):
// `logits --device cuda --world-size 2` with a `--device cuda` worker must equal the one-GPU
// `logits --device cuda` run (greedy ids identical, logits within 1e-3 of their range; the split
// is exact, so they are expected bit for bit) on tiny-s0 (one-shot and chunked prefill) and
// tiny-long; tiny-s0's greedy ids are also the oracle's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../support/process.h"
#include "dsv41/loader/safetensors.h"

extern char** environ;

using namespace dsv41;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using dsv41::test::free_port;
using dsv41::test::spawn_binary;
const std::string kFix = DSV41_FIXTURES_DIR;

using dsv41::test::wait_exit;

using dsv41::test::slurp;

struct TpCase {
  fs::path dir;
  std::string model, map;
  nlohmann::json golden;
  std::vector<std::string> logits_args;  // the tool's arguments without --out / TP flags
};

TpCase prepare(const std::string& name, const std::string& label, const std::vector<std::string>& extra) {
  TpCase r;
  r.dir = fs::temp_directory_path() / ("dsv41_cuda_tp_" + std::to_string(::getpid())) / label;
  fs::create_directories(r.dir);
  r.model = kFix + "/" + name + "/model";
  r.map = kFix + "/" + name + "/engram_token_map.safetensors";
  std::ifstream g(kFix + "/" + name + "/golden.json");
  r.golden = nlohmann::json::parse(g);
  std::ofstream(r.dir / "prompt.json") << r.golden["prompt_ids"].dump();
  const int64_t N = static_cast<int64_t>(r.golden["greedy_ids"].size()) - 1;
  r.logits_args = {"logits", "--device", "cuda", "--model", r.model, "--engram-token-map", r.map, "--prompt-ids",
                   (r.dir / "prompt.json").string(), "--decode", std::to_string(N)};
  r.logits_args.insert(r.logits_args.end(), extra.begin(), extra.end());
  return r;
}

std::vector<std::string> worker_args(const TpCase& r, int port, const std::string& device) {
  return {"--rank", "1", "--world-size", "2", "--model", r.model, "--master-addr", "127.0.0.1", "--master-port",
          std::to_string(port), "--device", device, "--engram-token-map", r.map};
}

void expect_cuda_tp2_equals_tp1(const std::string& name, const std::string& label,
                                const std::vector<std::string>& extra) {
  const TpCase r = prepare(name, label, extra);
  auto one = r.logits_args, two = r.logits_args;
  one.insert(one.end(), {"--out", (r.dir / "tp1.safetensors").string()});
  const int port = free_port();
  two.insert(two.end(), {"--out", (r.dir / "tp2.safetensors").string(), "--world-size", "2", "--master-port",
                         std::to_string(port)});
  // The worker (GPU 1: rank modulo the visible devices) starts first and retries until rank 0 listens.
  const pid_t worker = spawn_binary(worker_args(r, port, "cuda"), r.dir / "worker.log");
  ASSERT_GT(worker, 0);
  const pid_t head = spawn_binary(two, r.dir / "tp2.log");
  ASSERT_EQ(wait_exit(head, 120s), 0) << slurp(r.dir / "tp2.log") << "\n--- worker:\n" << slurp(r.dir / "worker.log");
  EXPECT_EQ(wait_exit(worker, 20s), 0) << "the worker exits when the tool is done\n" << slurp(r.dir / "worker.log");
  // The worker really ran the CUDA backend over NCCL, on the other GPU.
  EXPECT_NE(slurp(r.dir / "worker.log").find("joining the NCCL communicator on CUDA device 1"), std::string::npos)
      << slurp(r.dir / "worker.log");
  ASSERT_EQ(wait_exit(spawn_binary(one, r.dir / "tp1.log"), 120s), 0) << slurp(r.dir / "tp1.log");

  auto a = SafetensorsFile::open((r.dir / "tp1.safetensors").string());
  auto b = SafetensorsFile::open((r.dir / "tp2.safetensors").string());
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const TensorInfo& t : a->tensors()) {
    const TensorInfo* u = b->find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(t.shape, u->shape) << t.name;
    ASSERT_EQ(t.dtype, u->dtype) << t.name;
    if (t.dtype == DType::I32) {  // greedy ids
      EXPECT_EQ(std::memcmp(t.data, u->data, t.nbytes), 0) << label << ": " << t.name << " differ";
      continue;
    }
    const std::vector<float> x = tensor_to_f32(t), y = tensor_to_f32(*u);
    ASSERT_FALSE(x.empty()) << t.name;
    float worst = 0.0f, lo = x[0], hi = x[0];
    size_t identical = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, std::fabs(x[i] - y[i]));
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
      identical += x[i] == y[i];
    }
    EXPECT_LE(worst, 1e-3f * (hi - lo)) << label << ": " << t.name;
    std::printf("%s %s: max |tp2 - tp1| %g, range %g, bit-identical %zu of %zu\n", label.c_str(), t.name.c_str(),
                worst, hi - lo, identical, x.size());
  }
  if (name == "tiny-s0") {
    const TensorInfo* g = b->find("greedy_ids");
    ASSERT_NE(g, nullptr);
    std::vector<int32_t> ids(static_cast<size_t>(g->numel()));
    std::memcpy(ids.data(), g->data, ids.size() * 4);
    EXPECT_EQ(ids, r.golden["greedy_ids"].get<std::vector<int32_t>>());
  }
}

}  // namespace

TEST(CudaTensorParallelLogits, TwoGpusEqualOneGpuOnTinyS0) {
  expect_cuda_tp2_equals_tp1("tiny-s0", "s0", {});
}

TEST(CudaTensorParallelLogits, TwoGpusEqualOneGpuOnTinyS0ChunkedPrefill) {
  expect_cuda_tp2_equals_tp1("tiny-s0", "s0_chunk7", {"--prefill-chunk", "7"});
}

TEST(CudaTensorParallelLogits, TwoGpusEqualOneGpuOnTinyLong) {
  expect_cuda_tp2_equals_tp1("tiny-long", "long", {});
}

// A CPU worker cannot join a CUDA head: both ends fail at once with the reason (no hang in the
// NCCL communicator's formation).
TEST(CudaTensorParallelLogits, CpuWorkerUnderCudaHeadIsRefused) {
  const TpCase r = prepare("tiny-s0", "mixed", {});
  auto two = r.logits_args;
  const int port = free_port();
  two.insert(two.end(), {"--out", (r.dir / "o.safetensors").string(), "--world-size", "2", "--master-port",
                         std::to_string(port)});
  const pid_t head = spawn_binary(two, r.dir / "head.log");
  const pid_t worker = spawn_binary(worker_args(r, port, "cpu"), r.dir / "worker.log");
  EXPECT_EQ(wait_exit(worker, 60s), 1) << slurp(r.dir / "worker.log");
  EXPECT_EQ(wait_exit(head, 60s), 1) << slurp(r.dir / "head.log");
  EXPECT_NE(slurp(r.dir / "worker.log").find("rank 0 runs the CUDA backend"), std::string::npos)
      << slurp(r.dir / "worker.log");
  EXPECT_NE(slurp(r.dir / "head.log").find("rank 0 runs the CUDA backend"), std::string::npos)
      << slurp(r.dir / "head.log");
}
