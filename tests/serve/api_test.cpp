// The API in-process on the rule test double: shapes, streaming vs non-streaming, stop strings,
// logprobs, n, seeds, errors, auth, metrics, tokenize.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/utf8.h"
#include "rule_helpers.h"
#include "serve_fixture.h"
#include "http_client.h"
#include "../support/openai_answers.h"

using namespace dsv41;
using test_support::ServedRuleModel;
using J = nlohmann::ordered_json;

namespace {

J body_of(const serve::HttpResponse& r) { return J::parse(r.body); }

std::vector<J> stream_events(const std::string& sse) {
  std::vector<J> out;
  for (auto& e : test_support::sse_events(sse))
    out.push_back(e == "[DONE]" ? J("[DONE]") : J::parse(e));
  return out;
}

}  // namespace

TEST(Api, CompletionGreedyIdsEqualTheModelAndStreamAgrees) {
  ServedRuleModel s;
  const std::vector<int32_t> prompt = {5, 80, 81, 82, 200, 17};
  J req = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = s.call("POST", "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  J b = body_of(r);
  EXPECT_EQ(b["object"], "text_completion");
  EXPECT_EQ(b["choices"][0]["token_ids"].get<std::vector<int32_t>>(), test_support::rule_greedy(*s.model, prompt, 12));
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(b["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(b["usage"]["completion_tokens"], 12);
  EXPECT_EQ(b["usage"]["total_tokens"], 18);
  std::string text;
  for (int32_t id : test_support::rule_greedy(*s.model, prompt, 12)) text += s.text->token_bytes(id);
  EXPECT_EQ(b["choices"][0]["text"], text::utf8::decode_lossy(text));

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  auto rs = s.call("POST", "/v1/completions", req.dump());
  ASSERT_EQ(rs.status, 200);
  EXPECT_EQ(rs.content_type, "text/event-stream");
  auto ev = stream_events(ServedRuleModel::drain(rs));
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string streamed;
  std::vector<int32_t> ids;
  std::string finish;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    ASSERT_TRUE(ev[i]["usage"].is_null());
    for (auto& c : ev[i]["choices"]) {
      streamed += c["text"].get<std::string>();
      if (c.contains("token_ids")) for (auto& x : c["token_ids"]) ids.push_back(x.get<int32_t>());
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  J usage = ev[ev.size() - 2];
  EXPECT_TRUE(usage["choices"].is_array() && usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  EXPECT_EQ(streamed, b["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(ids, test_support::rule_greedy(*s.model, prompt, 12));
  EXPECT_EQ(finish, "length");
}

TEST(Api, StopStringAcrossTokenBoundaries) {
  ServedRuleModel s;
  // Scripted after the assistant marker: "hello world" = tokens hell|oĠ|w|o|r|l|d; stop "o w"
  // spans the 2nd and 3rd tokens.
  s.script("greet", "hello world and more");
  const auto prompt = s.text->encode("<｜User｜>greet<｜Assistant｜></think>");
  for (bool stream : {false, true}) {
    J req = {{"prompt", prompt}, {"max_tokens", 15}, {"temperature", 0}, {"stop", {"o w", "zzz"}}, {"stream", stream}};
    auto r = s.call("POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text, finish;
    if (!stream) {
      J b = body_of(r);
      text = b["choices"][0]["text"];
      finish = b["choices"][0]["finish_reason"];
    } else {
      for (auto& e : stream_events(ServedRuleModel::drain(r))) {
        if (e == "[DONE]") continue;
        for (auto& c : e["choices"]) {
          text += c["text"].get<std::string>();
          if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
        }
      }
    }
    EXPECT_EQ(text, "hell") << "stream=" << stream;
    EXPECT_EQ(finish, "stop");
  }
  // include_stop_str_in_output keeps the stop string.
  J req = {{"prompt", prompt}, {"max_tokens", 15}, {"temperature", 0}, {"stop", "o w"}, {"include_stop_str_in_output", true}};
  EXPECT_EQ(body_of(s.call("POST", "/v1/completions", req.dump()))["choices"][0]["text"], "hello w");
  // EOS ends a scripted answer with finish_reason stop and is not part of the text.
  req = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}};
  J b = body_of(s.call("POST", "/v1/completions", req.dump()));
  EXPECT_EQ(b["choices"][0]["text"], "hello world and more");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
  // The EOS that ended it was generated: usage counts it, token_ids and logprobs list it.
  req["return_token_ids"] = true;
  req["logprobs"] = 1;
  b = body_of(s.call("POST", "/v1/completions", req.dump()));
  const auto ids = b["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), static_cast<int32_t>(s.model->config().eos_token_id));
  EXPECT_EQ(b["usage"]["completion_tokens"], static_cast<int64_t>(s.text->encode("hello world and more").size()) + 1);
  EXPECT_EQ(b["usage"]["completion_tokens"], static_cast<int64_t>(ids.size()));
  EXPECT_EQ(b["choices"][0]["logprobs"]["tokens"].size(), ids.size());
}

TEST(Api, LogprobsNAndSeeds) {
  ServedRuleModel s;
  J req = {{"prompt", {7, 8, 9}}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 11}, {"n", 3}, {"logprobs", 2}};
  J a = body_of(s.call("POST", "/v1/completions", req.dump()));
  J b = body_of(s.call("POST", "/v1/completions", req.dump()));
  ASSERT_EQ(a["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a["choices"][i]["index"], i);
    EXPECT_EQ(a["choices"][i]["text"], b["choices"][i]["text"]);  // same seed, same request
    auto& lp = a["choices"][i]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 5u);
    ASSERT_EQ(lp["top_logprobs"][0].size(), 2u);
    for (auto& x : lp["token_logprobs"]) EXPECT_LE(x.get<double>(), 0.0);
  }
  EXPECT_EQ(a["usage"]["completion_tokens"], 15);
  // The logprob of a greedy token is log-softmax of the model's row.
  J g = {{"prompt", {7, 8, 9}}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1}};
  J gb = body_of(s.call("POST", "/v1/completions", g.dump()));
  std::vector<float> row(512);
  s.model->logits_row({7, 8, 9}, row.data());
  double z = 0;
  for (float v : row) z += std::exp(v);
  EXPECT_NEAR(gb["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 8.0 - std::log(z), 1e-4);
}

TEST(Api, BadInputGetsOpenAiErrors) {
  ServedRuleModel s;
  auto expect_error = [&](const std::string& path, const std::string& body, int status, const std::string& code_or_empty) {
    auto r = s.call("POST", path, body);
    EXPECT_TRUE(test::is_openai_error(r.status, r.body, status, code_or_empty)) << body;
  };
  expect_error("/v1/completions", "{not json", 400, "");
  expect_error("/v1/completions", "[1,2]", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "max_tokens": -1})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "max_tokens": "ten"})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "max_tokens": 1e300})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "max_tokens": 100000000000})", 400, "context_length_exceeded");
  expect_error("/v1/completions", R"({"prompt": [1,2], "temperature": "hot"})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "top_p": 0})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "n": 0})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,9999]})", 400, "");
  expect_error("/v1/completions", R"({"prompt": {"a": 1}})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "model": "gpt-4"})", 404, "model_not_found");
  expect_error("/v1/completions", R"({"prompt": [1,2], "stop": 5})", 400, "");
  expect_error("/v1/completions", R"({"prompt": [1,2], "logit_bias": {"x": 1}})", 400, "");
  std::vector<int> long_prompt(200, 7);
  expect_error("/v1/completions", J{{"prompt", long_prompt}}.dump(), 400, "context_length_exceeded");
  auto r = s.call("POST", "/v1/completions", J{{"prompt", long_prompt}}.dump());
  EXPECT_NE(J::parse(r.body)["error"]["message"].get<std::string>().find("maximum context length"), std::string::npos);
  expect_error("/v1/chat/completions", R"({"messages": "hi"})", 400, "");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": 101})", 400, "");
  EXPECT_EQ(s.call("GET", "/v1/nothing", "").status, 404);
  EXPECT_EQ(s.call("GET", "/v1/models/gpt-4", "").status, 404);
  // Unknown fields are ignored; the server keeps serving.
  auto ok = s.call("POST", "/v1/completions", R"({"prompt": [1,2], "max_tokens": 2, "frobnicate": {"x": [1]}, "user": "u"})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(s.call("GET", "/health", "").status, 200);
}

TEST(Api, AuthModelsHealthMetricsTokenize) {
  serve::ApiOptions ao;
  ao.api_key = "sekret";
  ServedRuleModel s({}, ao);
  EXPECT_EQ(s.call("GET", "/health", "").status, 200);  // no key needed
  for (const char* path : {"/v1/models", "/metrics"}) {
    EXPECT_EQ(s.call("GET", path, "").status, 401) << path;
    EXPECT_EQ(s.call("GET", path, "", {{"Authorization", "Bearer wrong"}}).status, 401);
  }
  EXPECT_EQ(s.call("POST", "/v1/completions", R"({"prompt":[1]})").status, 401);
  const std::vector<std::pair<std::string, std::string>> auth = {{"Authorization", "Bearer sekret"}};
  J models = J::parse(s.call("GET", "/v1/models", "", auth).body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 128);
  EXPECT_EQ(s.call("GET", "/v1/models/tiny", "", auth).status, 200);

  J tok = J::parse(s.call("POST", "/tokenize", R"({"prompt": "hello"})", auth).body);
  EXPECT_EQ(tok["tokens"].get<std::vector<int32_t>>(), s.text->encode("hello"));
  EXPECT_EQ(tok["count"], tok["tokens"].size());
  EXPECT_EQ(tok["max_model_len"], 128);
  J de = J::parse(s.call("POST", "/detokenize", J{{"tokens", tok["tokens"]}}.dump(), auth).body);
  EXPECT_EQ(de["prompt"], "hello");

  ASSERT_EQ(s.call("POST", "/v1/completions", R"({"prompt":[1,2,3],"max_tokens":4})", auth).status, 200);
  auto m = s.call("GET", "/metrics", "", auth);
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("vllm:generation_tokens_total{model_name=\"tiny\"} 4"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("vllm:prompt_tokens_total{model_name=\"tiny\"} 3"), std::string::npos);
  EXPECT_NE(m.body.find("vllm:num_requests_running{model_name=\"tiny\"}"), std::string::npos);
  EXPECT_NE(m.body.find("vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1"), std::string::npos);
  EXPECT_NE(m.body.find("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1"), std::string::npos);
}

TEST(Api, OverloadGives429WithRetryAfter) {
  sched::SchedulerOptions so;
  so.max_num_seqs = 1;
  so.max_waiting = 1;
  ServedRuleModel s(so);
  s.model->step_delay_ms = 20;
  // Fill the queue: streaming responses are accepted immediately.
  auto a = s.call("POST", "/v1/completions", R"({"prompt":[1,2],"max_tokens":30,"stream":true})");
  auto b = s.call("POST", "/v1/completions", R"({"prompt":[1,2],"max_tokens":30,"stream":true})");
  auto c = s.call("POST", "/v1/completions", R"({"prompt":[1,2],"max_tokens":30,"stream":true})");
  const int statuses[] = {a.status, b.status, c.status};
  int n429 = 0;
  for (int st : statuses) n429 += st == 429;
  EXPECT_GE(n429, 1);
  auto& refused = a.status == 429 ? a : b.status == 429 ? b : c;
  bool has_retry = false;
  for (auto& [k, v] : refused.headers) has_retry = has_retry || k == "Retry-After";
  EXPECT_TRUE(has_retry);
  EXPECT_EQ(J::parse(refused.body)["error"]["type"], "rate_limit_error");
}
