// The runtime guards wired into the server (the same RuntimeGuards the binary uses): falling
// MemAvailable (an injected source) stops admission with 503 + Retry-After, pauses prefill and
// preempts the youngest sequence without crashing or changing outputs; a stuck engine step fails
// every open request with 503 and a reason, turns /health unhealthy and recovers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "serve/runtime_guards.h"
#include "serve_fixture.h"

using namespace dsv41;
using namespace std::chrono_literals;
using J = nlohmann::ordered_json;

namespace {

struct FakeMemory {
  std::atomic<uint64_t> available{20 * runtime::kGiB};
  runtime::MemorySource source() {
    return [this] { return runtime::MemoryReading{available.load(), "injected MemAvailable"}; };
  }
};

// Scheduler + API on the rule model with the guards wired as run_serve wires them.
struct GuardedServer {
  explicit GuardedServer(runtime::StallConfig stall = {}) {
    text = std::make_unique<serve::TokenizerTextBackend>(
        text::Tokenizer::from_json_text(test_support::test_tokenizer_json()));
    model = std::make_unique<test_support::RuleModel>(test_support::tiny_config());
    runtime::WatchdogConfig w;
    w.margin_bytes = 4 * runtime::kGiB;
    w.hysteresis_bytes = runtime::kGiB;
    w.period = 20ms;
    w.retry_after_s = 7;
    guards = std::make_unique<serve::RuntimeGuards>(mem.source(), w, stall);
    sched::SchedulerOptions so;
    so.max_num_batched_tokens = 64;
    so.memory_ok = guards->memory_gate();
    sched = std::make_unique<sched::Scheduler>(*model, so);
    guards->attach(*sched);
    serve::ApiOptions ao;
    ao.model_names = {"tiny"};
    guards->api_hooks(ao);
    api = std::make_unique<serve::Api>(*sched, *text, ao);
    sched->start();
    guards->start();
  }
  ~GuardedServer() {
    guards->stop();
    sched->stop();
  }
  serve::HttpResponse call(const std::string& method, const std::string& path, const std::string& body = {}) {
    serve::HttpRequest r;
    r.method = method;
    r.path = path;
    r.body = body;
    return api->handle(r);
  }
  static std::string header(const serve::HttpResponse& r, const std::string& name) {
    for (auto& [k, v] : r.headers)
      if (k == name) return v;
    return "";
  }

  FakeMemory mem;
  std::unique_ptr<serve::TokenizerTextBackend> text;
  std::unique_ptr<test_support::RuleModel> model;
  std::unique_ptr<serve::RuntimeGuards> guards;
  std::unique_ptr<sched::Scheduler> sched;
  std::unique_ptr<serve::Api> api;
};

std::vector<int32_t> prompt_of(int seed, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (seed * 131 + i * 17) % 250);
  return p;
}

std::vector<int32_t> reference(test_support::RuleModel& m, std::vector<int32_t> h, int n) {
  std::vector<int32_t> out;
  std::vector<float> row(static_cast<size_t>(m.config().vocab_size));
  for (int i = 0; i < n; ++i) {
    m.logits_row(h, row.data());
    const int32_t id = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(id);
    h.push_back(id);
  }
  return out;
}

std::vector<int32_t> collect(sched::TokenChannel& ch) {
  std::vector<int32_t> ids;
  std::vector<sched::SampledToken> got;
  while (!ch.wait(got, 50ms)) {
  }
  for (auto& t : got) ids.push_back(t.id);
  return ids;
}

sched::GenerationRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  sched::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

template <class F>
bool eventually(F f, std::chrono::milliseconds limit = 5000ms) {
  for (auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < limit;) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

}  // namespace

TEST(RuntimeGuards, FallingMemoryStopsAdmissionPausesPrefillAndPreempts) {
  GuardedServer s;
  const J req = {{"model", "tiny"}, {"prompt", prompt_of(1, 6)}, {"max_tokens", 4}, {"temperature", 0}};
  ASSERT_EQ(s.call("POST", "/v1/completions", req.dump()).status, 200);

  // A long decode is running when memory starts to fall.
  s.model->step_delay_ms = 5;
  const auto long_prompt = prompt_of(2, 10);
  auto running = s.sched->submit(greedy(long_prompt, 100));
  // Wait for its first token, not for stats().running == 1: the finished request above may still
  // be counted as running until the scheduler's next publish, and memory falling before the long
  // request is admitted leaves nothing to preempt.
  std::vector<sched::SampledToken> early;
  ASSERT_TRUE(eventually([&] {
    running->wait(early, 10ms);
    return !early.empty();
  }));
  s.mem.available = 1 * runtime::kGiB;  // below the 4 GiB margin

  // The watchdog preempts the youngest (only) sequence: its state goes back to the pool.
  ASSERT_TRUE(eventually([&] { return s.sched->stats().preemptions_total >= 1 && s.sched->stats().running == 0; }))
      << s.sched->describe() << "watchdog low episodes " << s.guards->watchdog().low_episodes() << ", last: "
      << s.guards->watchdog().last_reason();
  EXPECT_TRUE(eventually([&] { return s.sched->pool().used_bytes() == 0; }));
  // New requests are refused before they take memory: 503, the watchdog's Retry-After, a reason.
  auto r = s.call("POST", "/v1/completions", req.dump());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(GuardedServer::header(r, "Retry-After"), "7");
  EXPECT_NE(r.body.find("low on memory"), std::string::npos) << r.body;
  EXPECT_EQ(s.call("POST", "/v1/chat/completions", J{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump()).status,
            503);
  // /health stays 200 (the process is fine) and says why it does not admit.
  auto h = s.call("GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(J::parse(h.body)["memory"]["state"], "low") << h.body;
  // Work that reaches the scheduler anyway is held: no prefill, no admission, no crash.
  auto held = s.sched->submit(greedy(prompt_of(3, 30), 5));
  std::this_thread::sleep_for(300ms);
  std::vector<sched::SampledToken> none;
  EXPECT_FALSE(held->wait(none, 0ms));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(s.sched->stats().running, 0);
  EXPECT_EQ(s.sched->pool().used_bytes(), 0);

  // Memory comes back: everything finishes, the preempted sequence recomputed to the same output.
  s.mem.available = 20 * runtime::kGiB;
  s.model->step_delay_ms = 0;
  std::vector<int32_t> long_ids;
  for (auto& t : early) long_ids.push_back(t.id);
  for (int32_t id : collect(*running)) long_ids.push_back(id);
  EXPECT_EQ(long_ids, reference(*s.model, long_prompt, 100));
  EXPECT_EQ(collect(*held), reference(*s.model, prompt_of(3, 30), 5));
  EXPECT_EQ(s.call("POST", "/v1/completions", req.dump()).status, 200);
  EXPECT_EQ(J::parse(s.call("GET", "/health").body)["memory"]["state"], "ok");
  EXPECT_TRUE(eventually([&] { return s.sched->pool().used_bytes() == 0; }));
}

TEST(RuntimeGuards, StuckStepFailsInFlightRequestsWith503AndRecovers) {
  const auto dumps = std::filesystem::temp_directory_path() / ("dsv41_stall_" + std::to_string(::getpid()));
  runtime::StallConfig sc;
  sc.stall_after = 300ms;
  sc.period = 25ms;
  sc.dump_dir = dumps.string();
  sc.thread_stacks = false;
  GuardedServer s(sc);
  const J req = {{"model", "tiny"}, {"prompt", prompt_of(4, 6)}, {"max_tokens", 3}, {"temperature", 0}};
  ASSERT_EQ(s.call("POST", "/v1/completions", req.dump()).status, 200);

  s.model->step_delay_ms = 2500;  // the next engine step hangs far longer than the stall timeout
  serve::HttpResponse in_flight, in_flight_stream;
  std::thread client([&] { in_flight = s.call("POST", "/v1/completions", req.dump()); });
  J sreq = req;
  sreq["stream"] = true;
  std::string stream_body;
  std::thread streamer([&] {
    auto r = s.call("POST", "/v1/completions", sreq.dump());
    stream_body = test_support::ServedRuleModel::drain(r);
  });
  client.join();
  streamer.join();
  EXPECT_EQ(in_flight.status, 503) << in_flight.body;
  EXPECT_NE(in_flight.body.find("not making progress"), std::string::npos) << in_flight.body;
  EXPECT_NE(stream_body.find("engine_stalled"), std::string::npos) << stream_body;
  auto h = s.call("GET", "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(J::parse(h.body)["stall"]["state"], "stalled") << h.body;
  // New work is refused while stalled, with the reason.
  auto refused = s.call("POST", "/v1/completions", req.dump());
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("not making progress"), std::string::npos) << refused.body;
  // The dump names the scheduler's state.
  const std::string dump = J::parse(h.body)["stall"]["last_dump"];
  EXPECT_TRUE(std::filesystem::exists(dump)) << dump;

  // The step finishes: progress resumes, /health recovers, requests succeed, the pool empties.
  s.model->step_delay_ms = 0;
  EXPECT_TRUE(eventually([&] { return s.call("GET", "/health").status == 200; }));
  EXPECT_EQ(s.call("POST", "/v1/completions", req.dump()).status, 200);
  EXPECT_TRUE(eventually([&] { return s.sched->pool().used_bytes() == 0 && s.model->live() == 0; }));
  std::filesystem::remove_all(dumps);
}
