// End to end on the real CPU engine and the tiny oracle checkpoint: greedy ids through the API
// (in-process socket server, and the dsv41-serve binary itself) equal `dsv41-serve logits` ids;
// streaming and non-streaming agree; chat works with a byte-level test vocabulary.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "http_client.h"
#include "../support/openai_answers.h"
#include "../support/process.h"
#include "../support/run_cli.h"
#include "sched/scheduler.h"
#include "serve/api.h"
#include "serve/text_backend_impl.h"
#include "test_tokenizer.h"

extern char** environ;

using namespace dsv41;
using namespace std::chrono_literals;
using J = nlohmann::ordered_json;

namespace {

const std::string kFix = DSV41_FIXTURES_DIR;
const std::string kModel = kFix + "/tiny-s0/model";
const std::string kMap = kFix + "/tiny-s0/engram_token_map.safetensors";

std::filesystem::path temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("dsv41_e2e_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

std::vector<int32_t> golden_prompt() {
  std::ifstream f(kFix + "/tiny-s0/golden.json");
  return J::parse(f)["prompt_ids"].get<std::vector<int32_t>>();
}

int run(std::vector<std::string> args, pid_t* pid_out = nullptr) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  if (pid_out) {
    *pid_out = pid;
    return 0;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The engine's own greedy ids from the `logits` tool (prompt + n-1 decode steps).
std::vector<int32_t> logits_tool_ids(const std::vector<int32_t>& prompt, int n) {
  const auto dir = temp_dir();
  const auto ids_file = (dir / "prompt.json").string(), out = (dir / "logits.safetensors").string();
  std::ofstream(ids_file) << J(prompt).dump();
  EXPECT_EQ(run({DSV41_BINARY, "logits", "--model", kModel, "--prompt-ids", ids_file, "--decode", std::to_string(n - 1),
                 "--engram-token-map", kMap, "--out", out}),
            0);
  auto f = SafetensorsFile::open(out);
  const TensorInfo* t = f->find("greedy_ids");
  EXPECT_NE(t, nullptr);
  if (!t) return {};
  std::vector<int32_t> ids;
  for (float v : tensor_to_f32(*t)) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

struct EngineServer {
  EngineServer() {
    model::CpuModelOptions mo;
    mo.engram_token_map = kMap;
    model = model::CpuModel::load(kModel, mo);
    text = std::make_unique<serve::TokenizerTextBackend>(text::Tokenizer::from_json_text(test_support::test_tokenizer_json()));
    sched::SchedulerOptions so;
    so.max_num_seqs = 4;
    so.kv_cache_gib = 0.01;
    sched = std::make_unique<sched::Scheduler>(*model, so);
    serve::ApiOptions ao;
    ao.model_names = {"tiny-s0"};
    api = std::make_unique<serve::Api>(*sched, *text, ao);
    serve::HttpServerOptions ho;
    ho.port = 0;
    http = std::make_unique<serve::HttpServer>(ho, [a = api.get()](const serve::HttpRequest& r) { return a->handle(r); });
    sched->start();
    http->start();
  }
  ~EngineServer() {
    sched->stop();
    http->stop();
  }
  std::unique_ptr<model::CpuModel> model;
  std::unique_ptr<serve::TokenizerTextBackend> text;
  std::unique_ptr<sched::Scheduler> sched;
  std::unique_ptr<serve::Api> api;
  std::unique_ptr<serve::HttpServer> http;
};

}  // namespace

TEST(EndToEnd, GreedyIdsThroughTheApiEqualTheLogitsTool) {
  const auto prompt = golden_prompt();
  const int n = 13;
  const auto expect = logits_tool_ids(prompt, n);
  ASSERT_EQ(expect.size(), static_cast<size_t>(n));
  EngineServer s;
  const int port = s.http->port();
  J req = {{"model", "tiny-s0"}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"return_token_ids", true},
           {"ignore_eos", true}};
  // Three at once: batched decode must not change anyone's tokens.
  std::vector<test_support::HttpResult> res(3);
  std::vector<std::thread> th;
  for (int i = 0; i < 3; ++i) th.emplace_back([&, i] { res[i] = test_support::http_request(port, "POST", "/v1/completions", req.dump()); });
  for (auto& t : th) t.join();
  for (auto& r : res) {
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(J::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expect);
  }
  req["stream"] = true;
  auto rs = test_support::http_request(port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(rs.status, 200);
  EXPECT_EQ(test::streamed_ids(rs), expect);
  // Seeded sampling is reproducible on the real engine.
  J sampled = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 1.0}, {"top_p", 0.9}, {"seed", 5}, {"return_token_ids", true}};
  auto a = test_support::http_request(port, "POST", "/v1/completions", sampled.dump());
  auto b = test_support::http_request(port, "POST", "/v1/completions", sampled.dump());
  EXPECT_EQ(J::parse(a.body)["choices"][0]["token_ids"], J::parse(b.body)["choices"][0]["token_ids"]);
  EXPECT_EQ(s.model->config().vocab_size, 512);
}

TEST(EndToEnd, ChatOnTheTinyEngineWithATestVocabulary) {
  EngineServer s;
  J req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 6}, {"temperature", 0},
           {"chat_template_kwargs", {{"thinking", false}}}};
  auto r = test_support::http_request(s.http->port(), "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  J b = J::parse(r.body);
  EXPECT_EQ(b["usage"]["prompt_tokens"], static_cast<int64_t>(s.text->encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>").size()));
  EXPECT_LE(b["usage"]["completion_tokens"].get<int>(), 6);
  req["stream"] = true;
  auto rs = test_support::http_request(s.http->port(), "POST", "/v1/chat/completions", req.dump());
  auto ev = test_support::sse_events(rs.body);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string content;
  for (auto& e : ev) {
    if (e == "[DONE]") continue;
    const J chunk = J::parse(e);
    for (auto& c : chunk["choices"])
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
  }
  const J& msg = b["choices"][0]["message"];
  EXPECT_EQ(content, msg["content"].is_null() ? std::string() : msg["content"].get<std::string>());
}

TEST(EndToEnd, TheBinaryServesAndStopsOnSigterm) {
  const auto dir = temp_dir();
  const std::string tok = (dir / "tokenizer.json").string();
  test_support::write_test_tokenizer(tok);
  // A free port: bind 0, read it, release it.
  int port = 0;
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  pid_t pid = 0;
  ASSERT_EQ(run({DSV41_BINARY, "--model", kModel, "--tokenizer", tok, "--engram-token-map", kMap, "--port",
                 std::to_string(port), "--kv-cache-gib", "0.01", "--api-key", "k1", "--served-model-name", "tiny-s0",
                 "--memory-margin-gib", "0.25", "--log-dir", (dir / "logs").string()},
                &pid),
            0);
  test_support::HttpResult h;
  for (int i = 0; i < 200 && h.status != 200; ++i) {
    std::this_thread::sleep_for(50ms);
    h = test_support::http_request(port, "GET", "/health");
  }
  ASSERT_EQ(h.status, 200);
  EXPECT_EQ(test_support::http_request(port, "GET", "/v1/models").status, 401);
  const auto prompt = golden_prompt();
  J req = {{"model", "tiny-s0"}, {"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = test_support::http_request(port, "POST", "/v1/completions", req.dump(), {{"Authorization", "Bearer k1"}});
  EXPECT_EQ(r.status, 200) << r.body;
  const auto expect = logits_tool_ids(prompt, 5);
  EXPECT_EQ(J::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expect);
  // The Engram store the server opened reports its reads on /metrics (tiny-s0 has Engram layers).
  auto m = test_support::http_request(port, "GET", "/metrics", "", {{"Authorization", "Bearer k1"}});
  ASSERT_EQ(m.status, 200);
  const auto value_of = [&](const std::string& name) {
    const size_t p = m.body.find("\n" + name + " ");
    return p == std::string::npos ? -1.0 : std::stod(m.body.substr(p + name.size() + 2));
  };
  EXPECT_GT(value_of("dsv41_engram_rows_requested_total"), 0.0) << m.body;
  EXPECT_GE(value_of("dsv41_engram_cache_hit_rate"), 0.0) << m.body;
  EXPECT_NE(m.body.find("dsv41_engram_read_latency_seconds"), std::string::npos);
  // The runtime guards answer on /health.
  auto health = J::parse(test_support::http_request(port, "GET", "/health").body);
  EXPECT_EQ(health["memory"]["state"], "ok") << health.dump();
  EXPECT_EQ(health["stall"]["state"], "ok") << health.dump();
  ::kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(EndToEnd, TheBinaryRefusesToStartBelowTheMemoryMarginWithTheTable) {
  const auto dir = temp_dir();
  const std::string tok = (dir / "tokenizer.json").string();
  test_support::write_test_tokenizer(tok);
  const std::string err = (dir / "stderr.txt").string();
  // No machine has 1000 GiB to spare: the budget check must refuse before loading anything.
  const std::string cmd = std::string(DSV41_BINARY) + " --model " + kModel + " --tokenizer " + tok +
                          " --engram-token-map " + kMap + " --port " + std::to_string(dsv41::test::free_port()) +
                          " --memory-margin-gib 1000 2> " + err;
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  std::ifstream f(err);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("memory budget"), std::string::npos) << text;
  EXPECT_NE(text.find("sequence-state pool"), std::string::npos) << text;
  EXPECT_NE(text.find("NOT ENOUGH"), std::string::npos) << text;
  EXPECT_NE(text.find("--memory-margin-gib"), std::string::npos) << text;
}

TEST(EndToEnd, ClearErrorsForBadRanksAndModelDirs) {
  // One precise message and exit code 1 for each bad start-up, before anything listens.
  const auto bad_rank = dsv41::test::run_cli("--model " + kModel + " --rank 2 --world-size 2", dsv41::test::Stderr::kMerge);
  EXPECT_EQ(bad_rank.exit_code, 1);
  EXPECT_NE(bad_rank.out.find("--rank 2 must be below --world-size 2"), std::string::npos) << bad_rank.out;
  const auto missing = dsv41::test::run_cli("--model " + kModel + "/missing", dsv41::test::Stderr::kMerge);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("no such folder"), std::string::npos) << missing.out;
}
