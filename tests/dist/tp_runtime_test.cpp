// Tensor parallel across two local processes (CPU collective over TCP): `logits --world-size 2`
// equals TP 1 on the oracle fixtures, the server on rank 0 with a worker answers like TP 1, a
// worker that hangs or dies fails requests with 503 naming the rank within 5 s, a restarted worker
// is adopted again, and mismatched workers are refused.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../engram/split_fixture.h"
#include "../support/tp_server.h"
#include "../serve/http_client.h"
#include "../serve/test_tokenizer.h"
#include "dsv41/loader/safetensors.h"

extern char** environ;

using namespace dsv41;
using namespace std::chrono_literals;
using J = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

using dsv41::test::free_port;
using dsv41::test::spawn_binary;
const std::string kFix = DSV41_FIXTURES_DIR;

fs::path temp_dir() { return dsv41::test::test_temp_dir("dsv41_tp_"); }

using dsv41::test::wait_exit;

using dsv41::test::slurp;

struct Fixture {
  std::string name, model, map;
  J golden;
};

Fixture fixture(const std::string& name) {
  Fixture f{name, kFix + "/" + name + "/model", kFix + "/" + name + "/engram_token_map.safetensors", {}};
  std::ifstream g(kFix + "/" + name + "/golden.json");
  f.golden = J::parse(g);
  return f;
}

std::vector<std::string> worker_args(const Fixture& f, const std::string& model, int port, int rank = 1,
                                     int world = 2) {
  return {"--rank", std::to_string(rank), "--world-size", std::to_string(world), "--model", model, "--master-addr",
          "127.0.0.1", "--master-port", std::to_string(port), "--device", "cpu", "--engram-token-map", f.map};
}

// Runs `logits` at TP 1 and at TP 2 (a worker process started first) and compares every tensor.
// model_dir: another checkpoint with the fixture's config (default: the fixture's own).
// worker_extra: flags every worker gets too (e.g. where the Engram rows are).
void expect_tp2_equals_tp1(const std::string& name, const std::vector<std::string>& extra,
                           const std::string& model_dir = {}, const std::string& label = {}, int world = 2,
                           const std::vector<std::string>& worker_extra = {}) {
  Fixture f = fixture(name);
  if (!model_dir.empty()) f.model = model_dir;
  const fs::path dir = temp_dir() / (label.empty() ? name : label);
  fs::create_directories(dir);
  {
    std::ofstream(dir / "prompt.json") << f.golden["prompt_ids"].dump();
  }
  const int64_t N = static_cast<int64_t>(f.golden["greedy_ids"].size()) - 1;
  std::vector<std::string> base = {"logits", "--model", f.model, "--engram-token-map", f.map, "--prompt-ids",
                                   (dir / "prompt.json").string(), "--decode", std::to_string(N)};
  base.insert(base.end(), extra.begin(), extra.end());
  auto one = base, two = base;
  one.insert(one.end(), {"--out", (dir / "tp1.safetensors").string()});
  const int port = free_port();
  two.insert(two.end(), {"--out", (dir / "tp2.safetensors").string(), "--world-size", std::to_string(world),
                         "--master-port", std::to_string(port)});
  // The workers start first and retry until rank 0 listens.
  std::vector<pid_t> workers;
  for (int r = 1; r < world; ++r) {
    auto wa = worker_args(f, f.model, port, r, world);
    wa.insert(wa.end(), worker_extra.begin(), worker_extra.end());
    workers.push_back(spawn_binary(wa, dir / ("worker" + std::to_string(r) + ".log")));
    ASSERT_GT(workers.back(), 0);
  }
  const pid_t head = spawn_binary(two, dir / "tp2.log");
  ASSERT_EQ(wait_exit(head, 120s), 0) << slurp(dir / "tp2.log");
  for (int r = 1; r < world; ++r)
    EXPECT_EQ(wait_exit(workers[r - 1], 10s), 0) << "a worker exits when the tool is done\n"
                                                 << slurp(dir / ("worker" + std::to_string(r) + ".log"));
  ASSERT_EQ(wait_exit(spawn_binary(one, dir / "tp1.log"), 120s), 0) << slurp(dir / "tp1.log");

  auto a = SafetensorsFile::open((dir / "tp1.safetensors").string());
  auto b = SafetensorsFile::open((dir / "tp2.safetensors").string());
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const TensorInfo& t : a->tensors()) {
    const TensorInfo* u = b->find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(t.shape, u->shape) << t.name;
    ASSERT_EQ(t.dtype, u->dtype) << t.name;
    if (t.dtype == DType::I32) {
      EXPECT_EQ(std::memcmp(t.data, u->data, t.nbytes), 0) << name << ": " << t.name << " differ";
      continue;
    }
    const std::vector<float> x = tensor_to_f32(t), y = tensor_to_f32(*u);
    float worst = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
    EXPECT_LE(worst, 1e-3f) << name << ": " << t.name;
  }
  // The greedy ids are also the oracle's (the TP 1 engine matches tiny-s0's golden ids).
  const TensorInfo* g = b->find("greedy_ids");
  std::vector<int32_t> ids(static_cast<size_t>(g->numel()));
  std::memcpy(ids.data(), g->data, ids.size() * 4);
  if (name == "tiny-s0" && model_dir.empty()) EXPECT_EQ(ids, f.golden["greedy_ids"].get<std::vector<int32_t>>());
}

}  // namespace

TEST(TensorParallelLogits, TwoRanksEqualOneRankOnTinyS0) { expect_tp2_equals_tp1("tiny-s0", {"--dspark", "--prefill-chunk", "7"}); }

TEST(TensorParallelLogits, TwoRanksEqualOneRankOnTinyLong) { expect_tp2_equals_tp1("tiny-long", {}); }

// Three ranks: uneven shares, and a rank without attention groups (tiny-s0 has 2) still joins in.
TEST(TensorParallelLogits, ThreeRanksEqualOneRankOnTinyS0) {
  expect_tp2_equals_tp1("tiny-s0", {"--dspark"}, {}, "tiny-s0-world3", 3);
}

// EXL3 checkpoints: unquantized (F16) slices are cut by rows, EXL3 linears compute all rows and keep
// their share, an EXL3 head is replicated; still TP 2 == TP 1.
TEST(TensorParallelLogits, TwoRanksEqualOneRankOnExl3Checkpoints) {
  for (const auto& [label, args] : std::vector<std::pair<std::string, std::string>>{
           {"exl3_b3_head16", "--format exl3 --bits 3 --codebook mul1 --head-bits 16 --mtp-bits 2"},
           {"exl3_b2_head4", "--format exl3 --bits 2 --codebook 3inst --head-bits 4"}}) {
    const fs::path dir = temp_dir() / label;
    fs::create_directories(dir);
    const std::string cmd = std::string(DSV41_BINARY) + " mkmodel --config " + kFix + "/tiny-s0/model/config.json " +
                            args + " --seed 11 --out " + (dir / "model").string() + " > " + (dir / "mk.log").string() +
                            " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir / "mk.log");
    expect_tp2_equals_tp1("tiny-s0", {"--dspark", "--prefill-chunk", "13"}, (dir / "model").string(), label);
  }
}

// Engram tables outside the checkpoint (issue: Engram storage): the tables moved into their own
// shard folder (--engram-dir) and packed per rank (--engram-packed) give, at TP 2, exactly the
// TP 1 result; test_engram shows TP 1 from those sources equals the in-memory tables.
TEST(TensorParallelLogits, TwoRanksReadEngramRowsFromShardsAndPackedFiles) {
  engram::test::TempDir tmp;
  const auto m = engram::test::make_split_model(tmp.path());
  const std::string packed = tmp.sub("packed");
  for (int rank = 0; rank < 2; ++rank) {
    const std::string cmd = std::string(DSV41_BINARY) + " pack-engram --model " + m.main_dir + " --engram-dir " +
                            m.engram_dir + " --out " + packed + " --rank " + std::to_string(rank) +
                            " --world-size 2 --no-progress > " + tmp.sub("pack.log") + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(tmp.sub("pack.log"));
  }
  const std::vector<std::string> from_dir = {"--engram-dir", m.engram_dir};
  expect_tp2_equals_tp1("tiny-s0", from_dir, m.main_dir, "engram-dir", 2, from_dir);
  const std::vector<std::string> from_pack = {"--engram-packed", packed};
  expect_tp2_equals_tp1("tiny-s0", from_pack, m.main_dir, "engram-packed", 2, from_pack);
}

TEST(TensorParallelHandshake, MismatchedConfigOrCheckpointIsRefused) {
  const Fixture f = fixture("tiny-s0");
  const fs::path dir = temp_dir() / "mismatch";
  fs::create_directories(dir / "cfg");
  fs::create_directories(dir / "ckpt");
  // Same weights, a config that differs in one field; same config, weights that differ in one byte.
  J cfg = J::parse(slurp(f.model + "/config.json"));
  cfg["text_config"]["rope_theta"] = 20000;
  std::ofstream(dir / "cfg" / "config.json") << cfg.dump(2);
  fs::copy_file(f.model + "/model.safetensors", dir / "cfg" / "model.safetensors", fs::copy_options::overwrite_existing);
  fs::copy_file(f.model + "/config.json", dir / "ckpt" / "config.json", fs::copy_options::overwrite_existing);
  fs::copy_file(f.model + "/model.safetensors", dir / "ckpt" / "model.safetensors",
                fs::copy_options::overwrite_existing);
  {
    std::fstream w(dir / "ckpt" / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    w.seekg(-3, std::ios::end);
    char c = 0;
    w.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    w.seekp(-3, std::ios::end);
    w.write(&c, 1);
  }
  {
    std::ofstream(dir / "prompt.json") << "[1, 2, 3]";
  }
  const int port = free_port();
  const pid_t head = spawn_binary({"logits", "--model", f.model, "--engram-token-map", f.map, "--prompt-ids",
                            (dir / "prompt.json").string(), "--decode", "1", "--out", (dir / "o.safetensors").string(),
                            "--world-size", "2", "--master-port", std::to_string(port)},
                           dir / "head.log");
  ASSERT_GT(head, 0);
  EXPECT_EQ(wait_exit(spawn_binary(worker_args(f, (dir / "cfg").string(), port), dir / "w_cfg.log"), 30s), 1);
  EXPECT_NE(slurp(dir / "w_cfg.log").find("config hash"), std::string::npos) << slurp(dir / "w_cfg.log");
  EXPECT_EQ(wait_exit(spawn_binary(worker_args(f, (dir / "ckpt").string(), port), dir / "w_ck.log"), 30s), 1);
  EXPECT_NE(slurp(dir / "w_ck.log").find("checkpoint hash"), std::string::npos) << slurp(dir / "w_ck.log");
  // The head refused both and still waits: a matching worker completes the run.
  const pid_t good = spawn_binary(worker_args(f, f.model, port), dir / "w_ok.log");
  EXPECT_EQ(wait_exit(head, 60s), 0) << slurp(dir / "head.log");
  EXPECT_EQ(wait_exit(good, 10s), 0) << slurp(dir / "w_ok.log");
  EXPECT_NE(slurp(dir / "head.log").find("refused worker"), std::string::npos);
}

// `generate` with DSpark speculation: drafts, verify forwards and rollbacks (sequence clones and
// restores on the worker) give the same tokens and acceptance as one rank.
TEST(TensorParallelGenerate, SpeculativeGenerationEqualsOneRank) {
  const Fixture f = fixture("tiny-s0");
  const fs::path dir = temp_dir() / "generate";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "prompt.json") << "[5, 17, 33, 101, 7, 250, 64, 9]";
  }
  const std::vector<std::string> base = {"generate", "--model", f.model, "--engram-token-map", f.map, "--prompt-ids",
                                         (dir / "prompt.json").string(), "--max-tokens", "16", "--spec-method",
                                         "dspark"};
  ASSERT_EQ(wait_exit(spawn_binary(base, dir / "g1.log", dir / "g1.json"), 60s), 0) << slurp(dir / "g1.log");
  const int port = free_port();
  auto two = base;
  two.insert(two.end(), {"--world-size", "2", "--master-port", std::to_string(port)});
  const pid_t head = spawn_binary(two, dir / "g2.log", dir / "g2.json");
  const pid_t worker = spawn_binary(worker_args(f, f.model, port), dir / "worker.log");
  ASSERT_EQ(wait_exit(head, 60s), 0) << slurp(dir / "g2.log");
  EXPECT_EQ(wait_exit(worker, 10s), 0) << slurp(dir / "worker.log");
  const J a = J::parse(slurp(dir / "g1.json")), b = J::parse(slurp(dir / "g2.json"));
  EXPECT_EQ(a["ids"].size(), 16u);
  EXPECT_EQ(a, b);
}

// A worker that passes the handshake but cannot load its share (here: an Engram folder that does
// not exist) reports that to rank 0, which then fails at once with the worker's message instead of
// waiting for a ready that never comes (the tools wait up to 30 min for workers to start).
TEST(TensorParallelHandshake, WorkerLoadFailureFailsRankZeroAtOnce) {
  const Fixture f = fixture("tiny-s0");
  const fs::path dir = temp_dir() / "load_failure";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "prompt.json") << "[1, 2, 3]";
  }
  const std::string missing = (dir / "no-such-engram-folder").string();
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t head = spawn_binary({"logits", "--model", f.model, "--engram-token-map", f.map, "--prompt-ids",
                                   (dir / "prompt.json").string(), "--decode", "1", "--out",
                                   (dir / "o.safetensors").string(), "--world-size", "2", "--master-port",
                                   std::to_string(port)},
                                  dir / "head.log");
  ASSERT_GT(head, 0);
  auto wa = worker_args(f, f.model, port);
  wa.insert(wa.end(), {"--engram-dir", missing});
  const pid_t worker = spawn_binary(wa, dir / "worker.log");
  EXPECT_EQ(wait_exit(worker, 60s), 1) << slurp(dir / "worker.log");
  EXPECT_EQ(wait_exit(head, 30s), 1) << slurp(dir / "head.log");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);
  const std::string log = slurp(dir / "head.log");
  EXPECT_NE(log.find("rank 1 failed while loading its share of the model"), std::string::npos) << log;
  EXPECT_NE(log.find("no-such-engram-folder"), std::string::npos) << log;  // the worker's own message
}
