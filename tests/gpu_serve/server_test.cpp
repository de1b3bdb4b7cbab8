// The dsv41-serve binary on the GPU (--device cuda) with the tiny oracle checkpoint: greedy ids
// through the API equal the fixture's, concurrent streams of different lengths equal their
// sequential runs, the state pool (device memory) is empty again afterwards, and a prompt over the
// context gets the OpenAI error object while the server stays healthy.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../serve/http_client.h"
#include "../serve/test_tokenizer.h"
#include "../support/openai_answers.h"
#include "../support/process.h"

using namespace dsv41;
using namespace std::chrono_literals;
using J = nlohmann::json;

namespace {

const std::string kFix = DSV41_FIXTURES_DIR;

J golden() {
  std::ifstream f(kFix + "/tiny-s0/golden.json");
  return J::parse(f);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// One dsv41-serve process on the GPU for the length of a test.
class GpuServer {
 public:
  // `extra`: further server flags (e.g. speculative decoding).
  explicit GpuServer(const std::vector<std::string>& extra = {}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("dsv41_gpu_serve_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
            "_" + std::to_string(instances_++));
    std::filesystem::create_directories(dir_);
    const std::string tok = (dir_ / "tokenizer.json").string();
    test_support::write_test_tokenizer(tok);
    port_ = test::free_port();
    // Small prefill chunks and 16-token blocks: prompts are prefilled in several steps and the
    // states grow in the pool while decoding.
    std::vector<std::string> args = {"--model", kFix + "/tiny-s0/model", "--engram-token-map",
                                     kFix + "/tiny-s0/engram_token_map.safetensors", "--tokenizer", tok, "--device",
                                     "cuda", "--port", std::to_string(port_), "--kv-cache-gib", "0.01",
                                     "--max-num-seqs", "8", "--max-num-batched-tokens", "32", "--served-model-name",
                                     "tiny-s0", "--memory-margin-gib", "0.25", "--log-dir", (dir_ / "logs").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = test::spawn_binary(args, log());
    for (int i = 0; i < 1200 && pid_ > 0; ++i) {  // CUDA start-up and weight upload: allow a minute
      if (test_support::http_request(port_, "GET", "/health").status == 200) {
        up_ = true;
        break;
      }
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  ~GpuServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  bool up() const { return up_; }
  int port() const { return port_; }
  std::filesystem::path log() const { return dir_ / "server.log"; }
  std::string log_text() const { return read_file(log()); }

  test_support::HttpResult post(const J& body) const {
    return test_support::http_request(port_, "POST", "/v1/completions", body.dump());
  }
  // The value of a /metrics gauge or counter (its first sample), NaN when absent.
  double metric(const std::string& name) const {
    return test::metric_sample(test_support::http_request(port_, "GET", "/metrics").body, name);
  }

  // Waits (a few seconds at most) for the engine loop to publish an empty pool; true when it did.
  // A finished sequence is dropped before its channel closes, but the gauges are refreshed by the
  // loop's next step.
  bool pool_empties() const {
    for (int i = 0; i < 100; ++i) {
      if (metric("dsv41:state_pool_used_bytes") == 0.0 && metric("dsv41:live_sequence_states") == 0.0) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool up_ = false;
  static inline int instances_ = 0;  // two servers in one test get separate folders
};

J greedy_request(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  return {{"model", "tiny-s0"}, {"prompt", prompt},       {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true}, {"return_token_ids", true}, {"stream", stream}};
}

// The token ids and finish reason of choice 0 of a streamed answer.
std::vector<int32_t> stream_ids(const test_support::HttpResult& r, std::string* finish) {
  EXPECT_EQ(r.status, 200) << r.body;
  const test::StreamedAnswer a = test::parse_stream(r);
  if (a.choices.empty()) return {};
  *finish = a.choices[0].finish_reason;
  return a.choices[0].ids;
}

}  // namespace

TEST(GpuServe, GreedyCompletionEqualsTheFixtureAndTheLogSaysCuda) {
  GpuServer s;
  ASSERT_TRUE(s.up()) << s.log_text();
  const J g = golden();
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto expect = g["greedy_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(test::answer_ids(s.post(greedy_request(prompt, static_cast<int>(expect.size()), false))), expect);
  std::string finish;
  EXPECT_EQ(stream_ids(s.post(greedy_request(prompt, static_cast<int>(expect.size()), true)), &finish), expect);
  EXPECT_EQ(finish, "length");
  // Start-up names the device, the CUDA memory breakdown and the capacity in tokens.
  const std::string log = s.log_text();
  EXPECT_NE(log.find("device: cuda:0"), std::string::npos) << log;
  EXPECT_NE(log.find("CUDA memory on cuda:0: weights"), std::string::npos) << log;
  EXPECT_NE(log.find("tokens (one sequence)"), std::string::npos) << log;
  EXPECT_NE(log.find("memory budget"), std::string::npos) << log;
  EXPECT_NE(log.find("free memory"), std::string::npos) << log;  // budgeted against the device
}

TEST(GpuServe, ConcurrentStreamsEqualSequentialRunsAndThePoolEmpties) {
  GpuServer s;
  ASSERT_TRUE(s.up()) << s.log_text();
  const auto full = golden()["prompt_ids"].get<std::vector<int32_t>>();
  // Eight requests of different prompt lengths and output lengths (within the 128-token context).
  const std::vector<std::pair<int, int>> shapes = {{5, 20}, {17, 9}, {30, 14}, {41, 31}, {56, 6}, {64, 25}, {77, 12}, {96, 13}};
  std::vector<std::vector<int32_t>> prompts, sequential(shapes.size()), concurrent(shapes.size());
  for (auto [len, n] : shapes) prompts.emplace_back(full.begin(), full.begin() + len);
  for (size_t i = 0; i < shapes.size(); ++i) {
    sequential[i] = test::answer_ids(s.post(greedy_request(prompts[i], shapes[i].second, false)));
    ASSERT_EQ(sequential[i].size(), static_cast<size_t>(shapes[i].second)) << i;
  }
  EXPECT_TRUE(s.pool_empties());
  std::vector<std::string> finish(shapes.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < shapes.size(); ++i)
    th.emplace_back([&, i] { concurrent[i] = stream_ids(s.post(greedy_request(prompts[i], shapes[i].second, true)), &finish[i]); });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(concurrent[i], sequential[i]) << "request " << i;
    EXPECT_EQ(finish[i], "length") << i;
  }
  // Every state went back to the pool.
  EXPECT_TRUE(s.pool_empties()) << "used " << s.metric("dsv41:state_pool_used_bytes") << " B, "
                                << s.metric("dsv41:live_sequence_states") << " live states";
  EXPECT_GT(s.metric("dsv41:state_pool_peak_bytes"), 0.0);  // the states really lived in the pool
  EXPECT_GT(s.metric("dsv41:state_pool_capacity_bytes"), 0.0);
}

TEST(GpuServe, APromptOverTheContextGetsTheOpenAIErrorAndTheServerStaysHealthy) {
  GpuServer s;
  ASSERT_TRUE(s.up()) << s.log_text();
  const std::vector<int32_t> too_long(200, 7);  // the tiny model's context is 128 tokens
  const auto r = s.post(greedy_request(too_long, 4, false));
  EXPECT_EQ(r.status, 400) << r.body;
  const J b = J::parse(r.body);
  ASSERT_TRUE(b.contains("error")) << r.body;
  EXPECT_TRUE(b["error"]["message"].is_string());
  EXPECT_NE(b["error"]["message"].get<std::string>().find("maximum context length"), std::string::npos) << r.body;
  EXPECT_TRUE(b["error"]["type"].is_string());
  EXPECT_EQ(b["error"]["code"], "context_length_exceeded") << r.body;
  // The same over a stream.
  EXPECT_EQ(s.post(greedy_request(too_long, 4, true)).status, 400);
  EXPECT_EQ(test_support::http_request(s.port(), "GET", "/health").status, 200);
  const J g = golden();
  const auto expect = g["greedy_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(test::answer_ids(s.post(greedy_request(g["prompt_ids"].get<std::vector<int32_t>>(), static_cast<int>(expect.size()), false))),
            expect);
  EXPECT_TRUE(s.pool_empties());
}

// Speculative decoding with the checkpoint's drafter on the GPU: greedy output through the API is
// exactly the non-speculative output (the fixture's ids), alone and for concurrent requests of
// different lengths, and the drafts were really verified (the spec counters moved).
TEST(GpuServe, SpeculativeDecodingKeepsGreedyOutputExact) {
  GpuServer s({"--spec-method", "dspark", "--spec-tokens", "3"});
  ASSERT_TRUE(s.up()) << s.log_text();
  const J g = golden();
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto expect = g["greedy_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(test::answer_ids(s.post(greedy_request(prompt, static_cast<int>(expect.size()), false))), expect);
  GpuServer plain;
  ASSERT_TRUE(plain.up()) << plain.log_text();
  const std::vector<std::pair<int, int>> shapes = {{9, 18}, {33, 11}, {50, 27}, {71, 16}};
  std::vector<std::vector<int32_t>> want(shapes.size()), got(shapes.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::vector<int32_t> p(prompt.begin(), prompt.begin() + shapes[i].first);
    want[i] = test::answer_ids(plain.post(greedy_request(p, shapes[i].second, false)));
    th.emplace_back([&, i, p] {
      std::string finish;
      got[i] = stream_ids(s.post(greedy_request(p, shapes[i].second, true)), &finish);
    });
  }
  for (auto& t : th) t.join();
  for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_GT(s.metric("vllm:spec_decode_num_draft_tokens_total"), 0.0);
  EXPECT_TRUE(s.pool_empties());
}
