// /v1/chat/completions on scripted outputs (the rule test double emits a fixed answer after the
// Assistant marker): reasoning fields, tool calls, streaming vs non-streaming, usage, logprobs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "http_client.h"
#include "serve_fixture.h"

using namespace dsv41;
using test_support::ServedRuleModel;
using J = nlohmann::ordered_json;

namespace {

const char* kCall =
    "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ "
    "parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter name=\"tz\" "
    "string=\"true\">CET</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";

J tools() {
  return J::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}},
                      {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}])");
}

// Everything a streamed chat completion said, merged like a client would.
struct Merged {
  std::string reasoning, reasoning_alias, content, finish;
  std::map<int, J> calls;
  J usage;
  int role_chunks = 0;
  bool done = false;
};

Merged merge_stream(const std::string& sse) {
  Merged m;
  for (auto& e : test_support::sse_events(sse)) {
    if (e == "[DONE]") {
      m.done = true;
      continue;
    }
    const J chunk = J::parse(e);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage") && !chunk["usage"].is_null()) m.usage = chunk["usage"];
    for (auto& c : chunk["choices"]) {
      const J& d = c["delta"];
      if (d.contains("role")) ++m.role_chunks;
      if (d.contains("reasoning_content")) m.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("reasoning")) m.reasoning_alias += d["reasoning"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) m.content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (auto& tc : d["tool_calls"]) {
          J& acc = m.calls[tc["index"].get<int>()];
          if (tc.contains("id")) acc["id"] = tc["id"];
          if (tc.contains("function") && tc["function"].contains("name")) acc["name"] = tc["function"]["name"];
          acc["arguments"] = acc.value("arguments", std::string()) + tc["function"].value("arguments", std::string());
        }
      if (!c["finish_reason"].is_null()) m.finish = c["finish_reason"];
    }
  }
  return m;
}

sched::SchedulerOptions long_context() {
  sched::SchedulerOptions o;
  o.max_model_len = 4096;
  o.max_num_batched_tokens = 4096;
  return o;
}

}  // namespace

TEST(Chat, ThinkingAnswerSplitsReasoningAndContent) {
  ServedRuleModel s(long_context());
  s.script("capital", "The user asks about France.</think>Paris is the capital.");
  J req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
           {"temperature", 0}, {"max_tokens", 100}};
  auto r = s.call("POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  J b = J::parse(r.body);
  EXPECT_EQ(b["object"], "chat.completion");
  const J& msg = b["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["reasoning_content"], "The user asks about France.");
  EXPECT_EQ(msg["reasoning"], "The user asks about France.");
  EXPECT_EQ(msg["content"], "Paris is the capital.");
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
  const int64_t reasoning_tokens = b["usage"]["completion_tokens_details"]["reasoning_tokens"];
  const int64_t completion = b["usage"]["completion_tokens"];
  // The generated EOS counts as a completion token (OpenAI / vLLM usage semantics).
  EXPECT_EQ(completion, static_cast<int64_t>(s.text->encode("The user asks about France.</think>Paris is the capital.").size()) + 1);
  EXPECT_EQ(reasoning_tokens, static_cast<int64_t>(s.text->encode("The user asks about France.</think>").size()));

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  auto m = merge_stream(ServedRuleModel::drain(s.call("POST", "/v1/chat/completions", req.dump())));
  EXPECT_TRUE(m.done);
  EXPECT_EQ(m.role_chunks, 1);
  EXPECT_EQ(m.reasoning, msg["reasoning_content"].get<std::string>());
  EXPECT_EQ(m.reasoning_alias, msg["reasoning"].get<std::string>());
  EXPECT_EQ(m.content, msg["content"].get<std::string>());
  EXPECT_EQ(m.finish, "stop");
  EXPECT_EQ(m.usage, b["usage"]);
}

TEST(Chat, ChatModeIsAllContent) {
  ServedRuleModel s(long_context());
  s.script("hi", "Hello there!");
  for (J kwargs : {J{{"thinking", false}}, J{{"enable_thinking", false}}}) {
    J req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"temperature", 0}, {"chat_template_kwargs", kwargs}};
    J b = J::parse(s.call("POST", "/v1/chat/completions", req.dump()).body);
    EXPECT_EQ(b["choices"][0]["message"]["content"], "Hello there!") << b.dump();
    EXPECT_TRUE(b["choices"][0]["message"]["reasoning_content"].is_null());
    EXPECT_EQ(b["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
  }
}

TEST(Chat, ToolCallsParsedStreamedAndLimited) {
  ServedRuleModel s(long_context());
  s.script("weather", std::string("Need the weather.</think>") + kCall);
  J req = {{"messages", {{{"role", "user"}, {"content", "weather in Paris?"}}}}, {"tools", tools()}, {"temperature", 0},
           {"max_tokens", 1000}};
  J b = J::parse(s.call("POST", "/v1/chat/completions", req.dump()).body);
  const J& msg = b["choices"][0]["message"];
  ASSERT_TRUE(msg.contains("tool_calls")) << b.dump();
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(J::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), J({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(msg["tool_calls"][1]["function"]["name"], "get_time");
  EXPECT_NE(msg["tool_calls"][0]["id"], msg["tool_calls"][1]["id"]);
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["reasoning_content"], "Need the weather.");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "tool_calls");

  req["stream"] = true;
  auto m = merge_stream(ServedRuleModel::drain(s.call("POST", "/v1/chat/completions", req.dump())));
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[0]["name"], "get_weather");
  EXPECT_EQ(J::parse(m.calls[0]["arguments"].get<std::string>()), J({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(m.calls[1]["name"], "get_time");
  EXPECT_EQ(m.content, "");  // no markup leaked
  EXPECT_EQ(m.finish, "tool_calls");

  // parallel_tool_calls false keeps the first call only.
  req["stream"] = false;
  req["parallel_tool_calls"] = false;
  b = J::parse(s.call("POST", "/v1/chat/completions", req.dump()).body);
  EXPECT_EQ(b["choices"][0]["message"]["tool_calls"].size(), 1u);
  // tool_choice none: no calls, and no markup in the content.
  req.erase("parallel_tool_calls");
  req["tool_choice"] = "none";
  b = J::parse(s.call("POST", "/v1/chat/completions", req.dump()).body);
  EXPECT_FALSE(b["choices"][0]["message"].contains("tool_calls"));
  const J content = b["choices"][0]["message"]["content"];
  if (content.is_string()) EXPECT_EQ(content.get<std::string>().find("DSML"), std::string::npos);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
}

TEST(Chat, ToolRoundTripHistoryIsAccepted) {
  ServedRuleModel s(long_context());
  s.script("18 degrees", "It is sunny.</think>It is 18 degrees and sunny in Paris.");
  J req = J::parse(R"({"messages":[{"role":"user","content":"weather in Paris?"},
    {"role":"assistant","content":null,"reasoning_content":"Need the weather.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"18 degrees, sunny"}],"temperature":0})");
  req["tools"] = tools();
  auto r = s.call("POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  J b = J::parse(r.body);
  EXPECT_EQ(b["choices"][0]["message"]["content"], "It is 18 degrees and sunny in Paris.");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
}

TEST(Chat, LogprobsAndLengthFinish) {
  ServedRuleModel s(long_context());
  s.script("count", "one two three four five six");
  J req = {{"messages", {{{"role", "user"}, {"content", "count"}}}}, {"temperature", 0}, {"max_completion_tokens", 4},
           {"max_tokens", 50}, {"logprobs", true}, {"top_logprobs", 2}, {"chat_template_kwargs", {{"thinking", false}}}};
  J b = J::parse(s.call("POST", "/v1/chat/completions", req.dump()).body);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");  // max_completion_tokens wins
  EXPECT_EQ(b["usage"]["completion_tokens"], 4);
  const J& lp = b["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  std::string joined;
  for (auto& e : lp) {
    joined += e["token"].get<std::string>();
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // greedy: the best is the chosen one
    EXPECT_TRUE(e["bytes"].is_array());
  }
  EXPECT_EQ(joined, b["choices"][0]["message"]["content"].get<std::string>());
}
