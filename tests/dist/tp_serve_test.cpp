// The server on rank 0 with a worker process (CPU collective over TCP): answers like TP 1; a worker
// that hangs mid-stream or dies fails requests with a clear 503 naming rank 1 within 5 s; after the
// worker restarts, requests succeed again without restarting the server.
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
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../serve/http_client.h"
#include "../support/tp_server.h"
#include "../serve/test_tokenizer.h"

extern char** environ;

using namespace std::chrono_literals;
using J = nlohmann::ordered_json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

namespace test = dsv41::test;

using test::kill_and_reap;
using test::slurp;
using test::wait_healthy;

pid_t start_worker(const fs::path& dir, int master_port, const std::string& tag) {
  return test::start_tp_worker(dir, master_port, "worker_" + tag + ".log");
}

}  // namespace

TEST(TensorParallelServe, AnswersLikeOneRankAndSurvivesAWorkerFailure) {
  const fs::path dir = test::test_temp_dir("dsv41_tpserve_");
  const std::string tok = (dir / "tokenizer.json").string();
  dsv41::test_support::write_test_tokenizer(tok);
  const std::vector<int32_t> prompt = {5, 17, 33, 101, 7, 250, 64};

  // TP 1 reference answers.
  test::TpServer one = test::start_tp_server(dir, tok, 1, "tp1");
  ASSERT_TRUE(wait_healthy(one.port, 60s)) << slurp(dir / "server_tp1.log");
  auto r1 = dsv41::test_support::http_request(one.port, "POST", "/v1/completions", test::tiny_completion(prompt, 6).dump());
  auto c1 = dsv41::test_support::http_request(one.port, "POST", "/v1/chat/completions", test::tiny_chat().dump());
  kill_and_reap(one.pid);
  ASSERT_EQ(r1.status, 200) << r1.body;
  ASSERT_EQ(c1.status, 200) << c1.body;
  const auto ids1 = J::parse(r1.body)["choices"][0]["token_ids"];

  // TP 2: the server first, the worker joins later.
  test::TpServer two = test::start_tp_server(dir, tok, 2, "tp2");
  pid_t worker = start_worker(dir, two.master_port, "a");
  ASSERT_TRUE(wait_healthy(two.port, 60s)) << slurp(dir / "server_tp2.log") << slurp(dir / "worker_a.log");
  auto r2 = dsv41::test_support::http_request(two.port, "POST", "/v1/completions", test::tiny_completion(prompt, 6).dump());
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(J::parse(r2.body)["choices"][0]["token_ids"], ids1);
  auto c2 = dsv41::test_support::http_request(two.port, "POST", "/v1/chat/completions", test::tiny_chat().dump());
  ASSERT_EQ(c2.status, 200) << c2.body;
  EXPECT_EQ(J::parse(c2.body)["choices"][0]["message"], J::parse(c1.body)["choices"][0]["message"]);

  // The worker hangs mid-stream (SIGSTOP): the stream ends with an error event naming rank 1.
  {
    J req = test::tiny_completion(prompt, 100);
    req["stream"] = true;
    dsv41::test_support::Socket s(two.port);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(s.send_all(dsv41::test_support::build_request("POST", "/v1/completions", req.dump(), {})));
    std::string raw;
    bool eof = false;
    const auto first_deadline = Clock::now() + 20s;
    while (raw.find("\"text\"") == std::string::npos && !eof && Clock::now() < first_deadline)
      raw += s.read_some(100, eof);
    ASSERT_NE(raw.find("\"text\""), std::string::npos) << raw;
    ::kill(worker, SIGSTOP);
    const auto t0 = Clock::now();
    while (!eof && !dsv41::test_support::response_complete(raw) && Clock::now() < t0 + 15s) raw += s.read_some(100, eof);
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_LT(waited, 5.0) << raw;
    EXPECT_NE(raw.find("tensor-parallel rank 1 is unavailable"), std::string::npos) << raw;
    EXPECT_NE(raw.find("rank_unavailable"), std::string::npos) << raw;
    EXPECT_NE(raw.find("no heartbeat"), std::string::npos) << raw;
  }
  kill_and_reap(worker);  // killed while stopped

  // The worker is gone: a request fails at once with 503 naming the rank.
  {
    const auto t0 = Clock::now();
    auto r = dsv41::test_support::http_request(two.port, "POST", "/v1/completions", test::tiny_completion(prompt, 3).dump());
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("tensor-parallel rank 1"), std::string::npos) << r.body;
    // /health tells load balancers the same thing, naming the rank.
    auto h = dsv41::test_support::http_request(two.port, "GET", "/health", {}, {}, 2000);
    EXPECT_EQ(h.status, 503) << h.body;
    EXPECT_EQ(J::parse(h.body)["ranks"]["ready"], false) << h.body;
    EXPECT_NE(J::parse(h.body)["ranks"]["reason"].get<std::string>().find("rank 1"), std::string::npos) << h.body;
  }

  // A restarted worker is adopted without restarting the server.
  worker = start_worker(dir, two.master_port, "b");
  dsv41::test_support::HttpResult r3;
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end) {
    r3 = dsv41::test_support::http_request(two.port, "POST", "/v1/completions", test::tiny_completion(prompt, 6).dump());
    if (r3.status == 200) break;
    EXPECT_EQ(r3.status, 503) << r3.body;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(r3.status, 200) << r3.body << slurp(dir / "worker_b.log");
  EXPECT_EQ(J::parse(r3.body)["choices"][0]["token_ids"], ids1);
  ::kill(two.pid, SIGTERM);
  int st = 0;
  ::waitpid(two.pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << slurp(dir / "server_tp2.log");
  // The server's goodbye sends the worker back to waiting for a head; end it.
  kill_and_reap(worker);
}
