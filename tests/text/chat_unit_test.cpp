// Encoder behaviour beyond the golden cases (CHAT.md §2), following the reference encoder's rules,
// and the OpenAI request mapping.
#include <gtest/gtest.h>

#include "dsv41/text/chat_template.h"
#include "dsv41/text/py_json.h"

namespace dsv41::text {
namespace {

using J = nlohmann::ordered_json;

const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEffort75 = "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

std::string render(const char* messages, bool thinking, const J& tools = J(), const J& rf = J(), J effort = J()) {
  ChatRenderOptions o;
  o.thinking = thinking;
  o.reasoning_effort = std::move(effort);
  return render_chat_prompt(J::parse(messages), tools, rf, o);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ChatError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ChatRender, ResponseFormatBlock) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Hi"}])", false, J(), J::parse(R"({"type": "json_object"})")),
            kBos + "<｜System｜>\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                   "{\"type\": \"json_object\"}<｜User｜>Hi<｜Assistant｜></think>");
}

TEST(ChatRender, ContentPartsJoinWithBlankLine) {
  EXPECT_EQ(render(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}])", false),
            kBos + "<｜User｜>a\n\nb<｜Assistant｜></think>");
  EXPECT_NE(error_of([] { render(R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])", false); })
                .find("image"),
            std::string::npos);
}

TEST(ChatRender, InvalidRequests) {
  EXPECT_EQ(error_of([] { render(R"([{"role":"function","content":"x"}])", true); }), "ValueError: Invalid role: function");
  for (const char* bad : {"true", "50.0", "0", "101", "\"xhigh\"", "\"medium\"", "-5"})
    EXPECT_NE(error_of([&] { render(R"([{"role":"user","content":"x"}])", true, J(), J(), J::parse(bad)); })
                  .find("Invalid reasoning effort"),
              std::string::npos)
        << bad;
  // the effort is validated in chat mode too, as the reference does
  EXPECT_NE(error_of([] { render(R"([{"role":"user","content":"x"}])", false, J(), J(), J(0)); }), "no error");
  EXPECT_NE(error_of([] { render(R"([{"role":"developer","content":""},{"role":"user","content":"x"}])", false); })
                .find("AssertionError: Invalid message for role `developer`"),
            std::string::npos);
  EXPECT_NE(error_of([] { render(R"([{"role":"user","content":null}])", false); }).find("TypeError"), std::string::npos);
}

TEST(ChatRender, EffortValues) {
  EXPECT_EQ(reasoning_effort_value(J()), 75);
  EXPECT_EQ(reasoning_effort_value(J("low")), 50);
  EXPECT_EQ(reasoning_effort_value(J("high")), 75);
  EXPECT_EQ(reasoning_effort_value(J("max")), 100);
  EXPECT_EQ(reasoning_effort_value(J(1)), 1);
  EXPECT_EQ(reasoning_effort_value(J(100)), 100);
  EXPECT_NE(render(R"([{"role":"user","content":"x"}])", true, J(), J(), J(1)).find("Reasoning Effort: 1 ("), std::string::npos);
}

TEST(ChatRender, ToolResultsFollowCallOrderUnknownFirst) {
  const char* msgs = R"([
    {"role":"user","content":"q"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
      {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"b","content":"B"},
    {"role":"tool","tool_call_id":"zzz","content":"Z"},
    {"role":"tool","tool_call_id":"a","content":"A"},
    {"role":"user","content":"and?"}])";
  const std::string p = render(msgs, false);
  EXPECT_NE(p.find("<｜User｜><tool_result>Z</tool_result>\n\n<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nand?<｜Assistant｜></think>"),
            std::string::npos)
      << p;
  // no parameters: the invoke holds an empty line
  EXPECT_NE(p.find("<｜DSML｜ invoke name=\"f\">\n\n</｜DSML｜ invoke>"), std::string::npos) << p;
}

TEST(ChatRender, DeveloperDroppedBeforeLastUserInThinkingMode) {
  EXPECT_EQ(render(R"([{"role":"developer","content":"Be brief"},{"role":"user","content":"Hi"},
                       {"role":"assistant","content":"Hello","reasoning_content":"greet"},{"role":"user","content":"Again"}])",
                   true),
            kBos + "<｜System｜>" + kEffort75 +
                "<｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜><think>");
  // in chat mode the developer turn renders as a user turn
  EXPECT_EQ(render(R"([{"role":"developer","content":"Be brief"},{"role":"user","content":"Hi"}])", false),
            kBos + "<｜User｜>Be brief<｜User｜>Hi<｜Assistant｜></think>");
}

TEST(ChatRender, MidConversationSystemIsLastUserTurn) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi!","reasoning":"r"},
                       {"role":"system","content":"Now answer briefly."}])",
                   true),
            kBos + "<｜System｜>" + kEffort75 +
                "<｜User｜>Hello<｜Assistant｜></think>Hi!<｜end▁of▁sentence｜><｜System｜>Now answer briefly.<｜Assistant｜><think>");
}

TEST(ChatRender, ArgumentsDecodingAndPythonJson) {
  const char* msgs = R"([{"role":"user","content":"q"},
    {"role":"assistant","content":"ok","tool_calls":[
      {"id":"1","type":"function","function":{"name":"f","arguments":"\"{\\\"x\\\": 1.0, \\\"y\\\": \\\"é\\\"}\""}},
      {"id":"2","type":"function","function":{"name":"g","arguments":"[1,2]"}},
      {"id":"3","type":"function","function":{"name":"h","arguments":{"n":1e5,"s":"t\tab","o":{"k":[true,null]}}}}]},
    {"role":"tool","tool_call_id":"1","content":null}])";
  const std::string p = render(msgs, false);
  EXPECT_NE(p.find("<｜DSML｜ parameter name=\"x\" string=\"false\">1.0</｜DSML｜ parameter>\n"
                   "<｜DSML｜ parameter name=\"y\" string=\"true\">é</｜DSML｜ parameter>"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("<｜DSML｜ parameter name=\"arguments\" string=\"true\">[1,2]</｜DSML｜ parameter>"), std::string::npos) << p;
  EXPECT_NE(p.find("name=\"n\" string=\"false\">100000.0<"), std::string::npos) << p;
  EXPECT_NE(p.find("name=\"s\" string=\"true\">t\tab<"), std::string::npos) << p;
  EXPECT_NE(p.find("name=\"o\" string=\"false\">{\"k\": [true, null]}<"), std::string::npos) << p;
  EXPECT_NE(p.find("ok\n\n<｜DSML｜ calls>"), std::string::npos) << p;
  EXPECT_NE(p.find("<tool_result>None</tool_result>"), std::string::npos) << p;  // str(None), as the reference
}

TEST(PythonJson, MatchesJsonDumps) {
  const J v = J::parse(R"({"b": 1, "a": [1.0, 1e5, 1e-7, 0.1, 1e16, 1e15, 2.5e-4, -0.0, 12345678901234567890, -3],
                          "s": "naïve\t\"q\"\\ \u001b /slash \u007f", "e": {}, "l": [], "n": null, "t": true})");
  EXPECT_EQ(python_json_dumps(v),
            "{\"b\": 1, \"a\": [1.0, 100000.0, 1e-07, 0.1, 1e+16, 1000000000000000.0, 0.00025, -0.0, "
            "12345678901234567890, -3], \"s\": \"naïve\\t\\\"q\\\"\\\\ \\u001b /slash \x7f\", \"e\": {}, \"l\": [], "
            "\"n\": null, \"t\": true}");
  EXPECT_EQ(python_float_repr(123.456), "123.456");
  EXPECT_EQ(python_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(python_float_repr(1e22), "1e+22");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(5e-324), "5e-324");
}

TEST(ChatRequest, OpenAiKnobs) {
  auto req = [](const char* body) { return chat_request_from_openai(J::parse(body)); };
  const char* msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto r = req((std::string("{") + msgs + "}").c_str());
  EXPECT_TRUE(r.options.thinking);
  EXPECT_TRUE(r.options.reasoning_effort.is_null());
  for (auto [alias, value] : std::vector<std::pair<const char*, int>>{
           {"minimal", 50}, {"low", 50}, {"medium", 75}, {"high", 75}, {"xhigh", 75}, {"max", 100}, {"ultra", 100}}) {
    r = req((std::string("{") + msgs + ",\"reasoning_effort\":\"" + alias + "\"}").c_str());
    EXPECT_EQ(reasoning_effort_value(r.options.reasoning_effort), value) << alias;
  }
  r = req((std::string("{") + msgs + ",\"reasoning_effort\":33}").c_str());
  EXPECT_EQ(reasoning_effort_value(r.options.reasoning_effort), 33);
  EXPECT_FALSE(req((std::string("{") + msgs + ",\"reasoning_effort\":\"none\"}").c_str()).options.thinking);
  EXPECT_FALSE(req((std::string("{") + msgs + ",\"thinking\":{\"type\":\"disabled\"},\"reasoning_effort\":\"max\"}").c_str()).options.thinking);
  EXPECT_FALSE(req((std::string("{") + msgs + ",\"chat_template_kwargs\":{\"enable_thinking\":false}}").c_str()).options.thinking);
  EXPECT_TRUE(req((std::string("{") + msgs + ",\"chat_template_kwargs\":{\"thinking\":true}}").c_str()).options.thinking);
  for (const char* bad : {"\"extreme\"", "true", "0", "101", "2.5"})
    EXPECT_THROW(req((std::string("{") + msgs + ",\"reasoning_effort\":" + bad + "}").c_str()), ChatError) << bad;
  const char* tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}])";
  r = req((std::string("{") + msgs + "," + tools + "}").c_str());
  EXPECT_TRUE(r.parse_tool_calls);
  EXPECT_EQ(r.tools.size(), 1u);
  r = req((std::string("{") + msgs + "," + tools + ",\"tool_choice\":\"none\"}").c_str());
  EXPECT_FALSE(r.parse_tool_calls);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(req((std::string("{") + msgs + ",\"response_format\":{\"type\":\"text\"}}").c_str()).response_format.is_null());
  EXPECT_FALSE(req((std::string("{") + msgs + ",\"response_format\":{\"type\":\"json_object\"}}").c_str()).response_format.is_null());
  EXPECT_THROW(req("{\"messages\": []}"), ChatError);
  EXPECT_THROW(req(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code_interpreter"}]})"), ChatError);
}

}  // namespace
}  // namespace dsv41::text
