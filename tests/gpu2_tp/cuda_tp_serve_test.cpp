// The server on rank 0 with a rank-1 worker, both on the CUDA backend (one GPU each, NCCL; label
// gpu2): greedy completions and chat answers equal the one-GPU server's and the fixture, streamed
// and concurrent requests too, bad requests get OpenAI errors; a worker killed
// mid-stream ends the stream with an error naming the tensor-parallel failure within 5 s and later
// requests get 503 naming rank 1 (a CUDA worker cannot rejoin the communicator: no restart here).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../serve/http_client.h"
#include "../serve/test_tokenizer.h"
#include "../support/tp_server.h"

extern char** environ;

using namespace std::chrono_literals;
using J = nlohmann::ordered_json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

namespace test = dsv41::test;
const std::string kFix = DSV41_FIXTURES_DIR;

using test::kill_and_reap;
using test::slurp;
using test::wait_healthy;

J golden() {
  std::ifstream f(kFix + "/tiny-s0/golden.json");
  return J::parse(f);
}

J greedy_request(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  J r = test::tiny_completion(prompt, max_tokens);
  r["stream"] = stream;
  return r;
}

std::vector<int32_t> ids_of(const dsv41::test_support::HttpResult& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return {};
  return J::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

std::vector<int32_t> streamed_ids(const dsv41::test_support::HttpResult& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  std::vector<int32_t> ids;
  for (const std::string& e : dsv41::test_support::sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const J chunk = J::parse(e);  // named: a range-for over a member of a temporary would dangle
    for (const J& c : chunk["choices"])
      if (c.contains("token_ids"))
        for (const J& x : c["token_ids"]) ids.push_back(x.get<int32_t>());
  }
  EXPECT_FALSE(ids.empty()) << r.body;
  return ids;
}

// Prompts of different lengths cut from the fixture prompt, with different output lengths.
const std::vector<std::pair<int, int>> kShapes = {{5, 20}, {17, 9}, {30, 14}, {41, 31}, {56, 6}, {64, 25}, {77, 12}, {96, 13}};

std::vector<int32_t> shape_prompt(size_t i) {
  const auto full = golden()["prompt_ids"].get<std::vector<int32_t>>();
  return std::vector<int32_t>(full.begin(), full.begin() + kShapes[i].first);
}

const std::vector<std::string> kCuda = {"--device", "cuda"};

}  // namespace

TEST(CudaTensorParallelServe, AnswersLikeOneGpuAndFailsCleanlyWhenTheWorkerDies) {
  const fs::path dir = test::test_temp_dir("dsv41_cuda_tpserve_");
  const std::string tok = (dir / "tokenizer.json").string();
  dsv41::test_support::write_test_tokenizer(tok);
  const std::vector<int32_t> prompt = {5, 17, 33, 101, 7, 250, 64};

  test::TpServer one = test::start_tp_server(dir, tok, 1, "tp1", kCuda);
  ASSERT_TRUE(wait_healthy(one.port, 90s)) << slurp(dir / "server_tp1.log");
  auto r1 = dsv41::test_support::http_request(one.port, "POST", "/v1/completions", test::tiny_completion(prompt, 6).dump());
  auto c1 = dsv41::test_support::http_request(one.port, "POST", "/v1/chat/completions", test::tiny_chat().dump());
  std::vector<std::vector<int32_t>> one_gpu(kShapes.size());
  for (size_t i = 0; i < kShapes.size(); ++i)
    one_gpu[i] = ids_of(dsv41::test_support::http_request(one.port, "POST", "/v1/completions",
                                                          greedy_request(shape_prompt(i), kShapes[i].second, false).dump()));
  kill_and_reap(one.pid);
  ASSERT_EQ(r1.status, 200) << r1.body;
  ASSERT_EQ(c1.status, 200) << c1.body;
  const auto ids1 = J::parse(r1.body)["choices"][0]["token_ids"];
  ASSERT_EQ(ids1.size(), 6u) << r1.body;

  // The server first, the worker (GPU 1) joins later.
  test::TpServer two = test::start_tp_server(dir, tok, 2, "tp2", kCuda);
  const pid_t worker = test::start_tp_worker(dir, two.master_port, "worker.log", kCuda);
  ASSERT_TRUE(wait_healthy(two.port, 90s)) << slurp(dir / "server_tp2.log") << slurp(dir / "worker.log");
  EXPECT_NE(slurp(dir / "worker.log").find("joining the NCCL communicator on CUDA device 1"), std::string::npos)
      << slurp(dir / "worker.log");
  auto r2 = dsv41::test_support::http_request(two.port, "POST", "/v1/completions", test::tiny_completion(prompt, 6).dump());
  ASSERT_EQ(r2.status, 200) << r2.body << slurp(dir / "server_tp2.log");
  EXPECT_EQ(J::parse(r2.body)["choices"][0]["token_ids"], ids1);
  auto c2 = dsv41::test_support::http_request(two.port, "POST", "/v1/chat/completions", test::tiny_chat().dump());
  ASSERT_EQ(c2.status, 200) << c2.body;
  EXPECT_EQ(J::parse(c2.body)["choices"][0]["message"], J::parse(c1.body)["choices"][0]["message"]);

  // The server issue's end-to-end checks on the two-GPU server: the fixture's greedy ids through
  // the API, streaming equal to non-streaming, 8 concurrent streams equal to the one-GPU answers,
  // bad requests answered with the OpenAI error object while the server stays healthy and exact.
  const J g = golden();
  const auto fixture_prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto fixture_ids = g["greedy_ids"].get<std::vector<int32_t>>();
  const int n_fixture = static_cast<int>(fixture_ids.size());
  EXPECT_EQ(ids_of(dsv41::test_support::http_request(two.port, "POST", "/v1/completions",
                                                     greedy_request(fixture_prompt, n_fixture, false).dump())),
            fixture_ids);
  EXPECT_EQ(streamed_ids(dsv41::test_support::http_request(two.port, "POST", "/v1/completions",
                                                           greedy_request(fixture_prompt, n_fixture, true).dump())),
            fixture_ids);
  {
    std::vector<std::vector<int32_t>> got(kShapes.size());
    std::vector<std::thread> th;
    for (size_t i = 0; i < kShapes.size(); ++i)
      th.emplace_back([&, i] {
        got[i] = streamed_ids(dsv41::test_support::http_request(
            two.port, "POST", "/v1/completions", greedy_request(shape_prompt(i), kShapes[i].second, true).dump()));
      });
    for (auto& t : th) t.join();
    for (size_t i = 0; i < kShapes.size(); ++i) EXPECT_EQ(got[i], one_gpu[i]) << "request " << i;
    if (::testing::Test::HasFailure()) std::cerr << slurp(dir / "server_tp2.log") << slurp(dir / "worker.log");
  }
  {
    const auto too_long = dsv41::test_support::http_request(
        two.port, "POST", "/v1/completions", greedy_request(std::vector<int32_t>(200, 7), 4, false).dump());
    EXPECT_EQ(too_long.status, 400) << too_long.body;
    EXPECT_NE(too_long.body.find("context_length_exceeded"), std::string::npos) << too_long.body;
    const auto malformed = dsv41::test_support::http_request(two.port, "POST", "/v1/chat/completions", "{\"model\": ");
    EXPECT_EQ(malformed.status, 400) << malformed.body;
    EXPECT_NE(malformed.body.find("\"error\""), std::string::npos) << malformed.body;
    EXPECT_EQ(dsv41::test_support::http_request(two.port, "GET", "/health").status, 200);
    EXPECT_EQ(ids_of(dsv41::test_support::http_request(two.port, "POST", "/v1/completions",
                                                       greedy_request(shape_prompt(0), kShapes[0].second, false).dump())),
              one_gpu[0]);
  }

  // The worker dies mid-stream: the stream ends with an error event within 5 s.
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
    kill_and_reap(worker);
    const auto t0 = Clock::now();
    while (!eof && !dsv41::test_support::response_complete(raw) && Clock::now() < t0 + 15s) raw += s.read_some(100, eof);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0) << raw;
    EXPECT_NE(raw.find("tensor-parallel"), std::string::npos) << raw;
  }
  // Later requests fail at once with 503 naming rank 1.
  {
    const auto t0 = Clock::now();
    auto r = dsv41::test_support::http_request(two.port, "POST", "/v1/completions", test::tiny_completion(prompt, 3).dump());
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("tensor-parallel rank 1"), std::string::npos) << r.body;
  }
  ::kill(two.pid, SIGTERM);
  int st = 0;
  ::waitpid(two.pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << slurp(dir / "server_tp2.log");
}
