// The served API on the tiny model with DSpark speculation: a greedy completion returns the
// engine's own greedy tokens, and /metrics carries the speculative decoding counters.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../serve/test_tokenizer.h"
#include "serve/api.h"
#include "serve/text_backend_impl.h"
#include "spec_fixture.h"

using namespace dsv41;

TEST(SpecApi, CompletionAndMetricsWithSpeculation) {
  auto m = test_support::load_tiny("tiny-s0");
  const auto prompt = test_support::golden_ids("tiny-s0", "prompt_ids");
  const auto ref = test_support::engine_greedy(*m, prompt, 10);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), ref.begin(), ref.end());
  test_support::ScriptedDrafter drafter(*m, {{static_cast<int64_t>(prompt.size()), full}},
                                        [](int64_t, int64_t pos) { return pos % 4 == 1; });
  sched::SchedulerOptions so;
  so.max_num_batched_tokens = 4096;
  so.spec.method = spec::SpecMethod::dspark;
  so.spec.adaptive = false;
  sched::Scheduler sched(*m, so, &drafter);
  serve::TokenizerTextBackend text(text::Tokenizer::from_json_text(test_support::test_tokenizer_json()));
  serve::ApiOptions ao;
  ao.model_names = {"tiny"};
  serve::Api api(sched, text, ao);
  sched.start();

  serve::HttpRequest r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.body = nlohmann::json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0},
                          {"return_token_ids", true}}
               .dump();
  const auto resp = api.handle(r);
  ASSERT_EQ(resp.status, 200) << resp.body;
  const auto body = nlohmann::json::parse(resp.body);
  EXPECT_EQ(body["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ref);

  serve::HttpRequest mr;
  mr.method = "GET";
  mr.path = "/metrics";
  const std::string metrics = api.handle(mr).body;
  const auto st = sched.stats().spec;
  ASSERT_GT(st.verify_steps, 0);
  ASSERT_GT(st.accepted_tokens, 0);
  EXPECT_NE(metrics.find("vllm:spec_decode_num_drafts_total{model_name=\"tiny\"} " + std::to_string(st.verify_steps) + "\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vllm:spec_decode_num_accepted_tokens_total{model_name=\"tiny\"} " +
                         std::to_string(st.accepted_tokens) + "\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("dsv41:spec_decode_accepted_drafts_bucket{model_name=\"tiny\",k=\"2\",le=\"+Inf\"}"),
            std::string::npos);
  EXPECT_NE(metrics.find("dsv41:spec_decode_mean_accepted_length"), std::string::npos);
  sched.stop();
}
