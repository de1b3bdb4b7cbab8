// Real sockets on 127.0.0.1: the same API through cpp-httplib, 64 concurrent streams with random
// disconnects, oversized bodies, slow-loris clients, malformed HTTP.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "http_client.h"
#include "../support/openai_answers.h"
#include "rule_helpers.h"
#include "serve_fixture.h"

using namespace dsv41;
using namespace std::chrono_literals;
using test_support::ServedRuleModel;
using J = nlohmann::ordered_json;

namespace {

bool wait_idle(ServedRuleModel& s, std::chrono::milliseconds limit) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < limit) {
    auto st = s.sched->stats();
    if (st.running == 0 && st.waiting == 0 && s.model->live() == 0 && st.pool_used_bytes == 0) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

}  // namespace

TEST(Socket, StreamingAndNonStreamingAgreeOverHttp) {
  ServedRuleModel s({}, {}, true);
  const int port = s.http->port();
  EXPECT_EQ(test_support::http_request(port, "GET", "/health").status, 200);
  const std::vector<int32_t> prompt = {9, 10, 11, 12};
  J req = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = test_support::http_request(port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(J::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), test_support::rule_greedy(*s.model, prompt, 10));
  req["stream"] = true;
  auto rs = test_support::http_request(port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(rs.status, 200);
  EXPECT_NE(rs.header("Content-Type").find("text/event-stream"), std::string::npos);
  auto ev = test_support::sse_events(rs.body);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const J chunk = J::parse(ev[i]);
    for (auto& c : chunk["choices"]) text += c["text"].get<std::string>();
  }
  EXPECT_EQ(text, J::parse(r.body)["choices"][0]["text"].get<std::string>());
}

TEST(Socket, SixtyFourStreamsWithRandomDisconnects) {
  sched::SchedulerOptions so;
  so.max_num_seqs = 16;
  so.max_num_batched_tokens = 64;
  ServedRuleModel s(so, {}, true);
  s.model->step_delay_ms = 2;
  const int port = s.http->port();
  constexpr int kClients = 64;
  std::vector<int> outcome(kClients, -1);  // 1 = completed correctly, 2 = disconnected on purpose, 0 = wrong
  std::vector<std::string> why(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 g(1000 + i);
      const bool drop = g() % 3 == 0;
      const size_t drop_after = 100 + g() % 1500;  // bytes of the stream read before leaving
      std::vector<int32_t> prompt = {static_cast<int32_t>(3 + i), static_cast<int32_t>(40 + g() % 400), 7, 8};
      J req = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"stream", true}, {"return_token_ids", true}};
      test_support::Socket sock(port);
      if (!sock.ok() || !sock.send_all(test_support::build_request("POST", "/v1/completions", req.dump()))) {
        outcome[i] = 0;
        why[i] = "connect";
        return;
      }
      std::string raw;
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      while (std::chrono::steady_clock::now() < deadline) {
        bool eof = false;
        raw += sock.read_some(100, eof);
        if (drop && raw.size() >= drop_after) {
          sock.close();
          outcome[i] = 2;
          return;
        }
        if (eof) break;
      }
      const test::StreamedAnswer a = test::parse_stream(test_support::parse_response(raw));
      const bool good = a.status == 200 && a.done && a.choices.size() == 1 &&
                        a.choices[0].ids == test_support::rule_greedy(*s.model, prompt, 40);
      outcome[i] = good ? 1 : (drop ? 2 : 0);  // a dropper may finish before reaching its byte count
      if (!good) why[i] = "status " + std::to_string(a.status) + " events " + std::to_string(a.events);
    });
  }
  for (auto& t : threads) t.join();
  int completed = 0, dropped = 0;
  for (int i = 0; i < kClients; ++i) {
    EXPECT_NE(outcome[i], 0) << "client " << i << ": " << why[i];
    completed += outcome[i] == 1;
    dropped += outcome[i] == 2;
  }
  EXPECT_GT(dropped, 5);
  EXPECT_GT(completed, 30);
  EXPECT_TRUE(wait_idle(s, 5s)) << "state pool did not return to empty";
  EXPECT_GT(s.sched->stats().finished_abort, 0);
  EXPECT_EQ(test_support::http_request(port, "GET", "/health").status, 200);
}

TEST(Socket, DisconnectCancelsWithinAStep) {
  ServedRuleModel s({}, {}, true);
  s.model->step_delay_ms = 10;
  test_support::Socket sock(s.http->port());
  ASSERT_TRUE(sock.send_all(test_support::build_request("POST", "/v1/completions",
                                                        R"({"prompt":[5,6,7],"max_tokens":100,"stream":true})")));
  std::string raw;
  while (raw.find("data: ") == std::string::npos) {
    bool eof = false;
    raw += sock.read_some(1000, eof);
    ASSERT_FALSE(eof);
  }
  EXPECT_EQ(s.model->live(), 1);
  sock.close();
  // The handler notices at its next write (a token every 10 ms), the scheduler at its next step.
  EXPECT_TRUE(wait_idle(s, 1s));
  EXPECT_LT(s.sched->stats().generation_tokens_total, 60);
}

TEST(Socket, OversizedBodySlowLorisAndGarbageLeaveTheServerHealthy) {
  serve::HttpServerOptions ho;
  ho.read_timeout_s = 1;
  ServedRuleModel s({}, {}, true, ho);
  const int port = s.http->port();
  // 10 MB body: 413 with an OpenAI error object.
  std::string big = R"({"prompt": ")" + std::string(10u << 20, 'a') + R"("})";
  auto r = test_support::http_request(port, "POST", "/v1/completions", big);
  EXPECT_EQ(r.status, 413);
  if (r.status == 413) EXPECT_TRUE(J::parse(r.body).contains("error")) << r.body;
  // Slow loris: a client that sends half a request and stalls is dropped after the read timeout,
  // while others are served.
  test_support::Socket slow(port);
  ASSERT_TRUE(slow.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"));
  EXPECT_EQ(test_support::http_request(port, "GET", "/health").status, 200);
  bool eof = false;
  std::string got;
  const auto t0 = std::chrono::steady_clock::now();
  while (!eof && got.find("\r\n\r\n") == std::string::npos && std::chrono::steady_clock::now() - t0 < 5s)
    got += slow.read_some(200, eof);
  // Dropped: answered with an error (and closed after keep-alive) or closed outright.
  EXPECT_TRUE(eof || got.rfind("HTTP/1.1 4", 0) == 0) << "the stalled connection was not dropped: " << got;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  // Garbage instead of HTTP.
  test_support::Socket junk(port);
  ASSERT_TRUE(junk.send_all("\x01\x02 this is not http\r\n\r\n"));
  got.clear();
  eof = false;
  while (!eof && !test_support::response_complete(got)) got += junk.read_some(2000, eof);
  EXPECT_EQ(got.find("HTTP/1.1 200"), std::string::npos);
  // Still healthy, and a normal request works.
  EXPECT_EQ(test_support::http_request(port, "GET", "/health").status, 200);
  EXPECT_EQ(test_support::http_request(port, "POST", "/v1/completions", R"({"prompt":[1,2],"max_tokens":2})").status, 200);
}

TEST(Socket, NonStreamingClientThatHangsUpIsCancelled) {
  ServedRuleModel s({}, {}, true);
  s.model->step_delay_ms = 10;
  {
    test_support::Socket sock(s.http->port());
    ASSERT_TRUE(sock.send_all(test_support::build_request("POST", "/v1/completions", R"({"prompt":[5,6,7],"max_tokens":100})")));
    const auto t0 = std::chrono::steady_clock::now();
    while (s.model->live() == 0 && std::chrono::steady_clock::now() - t0 < 2s) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(s.model->live(), 1);
  }  // closed before the answer: 100 tokens would take about a second
  EXPECT_TRUE(wait_idle(s, 500ms));
  EXPECT_LT(s.sched->stats().generation_tokens_total, 60);
  EXPECT_EQ(s.sched->stats().finished_abort, 1);
}
