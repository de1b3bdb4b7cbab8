// Streaming output parser: reasoning split, DSML tool calls, malformed markup, stop strings.
#include <gtest/gtest.h>

#include <map>

#include "dsv41/text/output_parser.h"
#include "text/utf8.h"
#include "text_test_util.h"

namespace dsv41::text {
namespace {

using J = nlohmann::json;

// What a client rebuilds from the event stream.
struct Rebuilt {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  bool operator==(const Rebuilt& o) const {
    if (reasoning != o.reasoning || content != o.content || calls.size() != o.calls.size()) return false;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name ||
          calls[i].arguments != o.calls[i].arguments)
        return false;
    return true;
  }
};

Rebuilt rebuild(const std::vector<OutputEvent>& events) {
  Rebuilt r;
  std::map<int, bool> ended;
  for (const auto& e : events) {
    switch (e.kind) {
      case OutputEvent::Kind::Reasoning: r.reasoning += e.text; break;
      case OutputEvent::Kind::Content: r.content += e.text; break;
      case OutputEvent::Kind::ToolCallStart:
        EXPECT_EQ(e.index, static_cast<int>(r.calls.size()));
        r.calls.push_back({e.id, e.name, ""});
        break;
      case OutputEvent::Kind::ToolCallArguments:
        EXPECT_GE(e.index, 0);
        EXPECT_FALSE(ended[e.index]) << "arguments after the end of call " << e.index;
        r.calls.at(static_cast<size_t>(e.index)).arguments += e.text;
        break;
      case OutputEvent::Kind::ToolCallEnd: ended[e.index] = true; break;
    }
  }
  for (size_t i = 0; i < r.calls.size(); ++i) EXPECT_TRUE(ended[static_cast<int>(i)]) << "call " << i << " never ended";
  return r;
}

OutputParserOptions opts(bool reasoning, bool tools = true) {
  OutputParserOptions o;
  o.starts_in_reasoning = reasoning;
  o.parse_tool_calls = tools;
  auto counter = std::make_shared<int>(0);
  o.make_call_id = [counter] { return "call_" + std::to_string((*counter)++); };
  return o;
}

Rebuilt parse_chunks(const std::vector<std::string>& chunks, OutputParserOptions o,
                     std::vector<OutputEvent>* all = nullptr) {
  OutputParser p(std::move(o));
  std::vector<OutputEvent> events;
  for (const auto& c : chunks) p.feed(c, events);
  p.finish(events);
  Rebuilt r = rebuild(events);
  // The totals kept by the parser agree with the event stream.
  EXPECT_EQ(p.reasoning(), r.reasoning);
  EXPECT_EQ(p.content(), r.content);
  EXPECT_EQ(p.tool_calls().size(), r.calls.size());
  for (size_t i = 0; i < std::min(p.tool_calls().size(), r.calls.size()); ++i)
    EXPECT_EQ(p.tool_calls()[i].arguments, r.calls[i].arguments);
  for (const auto& c : r.calls) EXPECT_TRUE(J::accept(c.arguments)) << c.arguments;
  if (all) *all = std::move(events);
  return r;
}

Rebuilt parse_whole(const std::string& s, OutputParserOptions o) { return parse_chunks({s}, std::move(o)); }

// Every split into two chunks and a byte-by-byte feed rebuild the same result, and no content
// event ever carries a piece of DSML markup.
void expect_split_invariant(const std::string& text, bool reasoning, const Rebuilt& want) {
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    std::vector<OutputEvent> events;
    const Rebuilt got = parse_chunks({text.substr(0, cut), text.substr(cut)}, opts(reasoning), &events);
    EXPECT_TRUE(got == want) << "split at byte " << cut << ": content [" << got.content << "] reasoning ["
                             << got.reasoning << "] calls " << got.calls.size();
    for (const auto& e : events)
      if (e.kind == OutputEvent::Kind::Content || e.kind == OutputEvent::Kind::Reasoning) {
        EXPECT_EQ(e.text.find("DSML"), std::string::npos) << "markup leaked at split " << cut;
        EXPECT_TRUE(utf8::is_valid(e.text));
      }
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_TRUE(parse_chunks(bytes, opts(reasoning)) == want) << "byte-by-byte feed";
}

const std::string kCallParis =
    "<｜DSML｜ invoke name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
    "</｜DSML｜ invoke>";

TEST(OutputParser, ReasoningThenContent) {
  const auto r = parse_whole("Two plus two.</think>It is 4.", opts(true));
  EXPECT_EQ(r.reasoning, "Two plus two.");
  EXPECT_EQ(r.content, "It is 4.");
  EXPECT_TRUE(r.calls.empty());
  expect_split_invariant("Two plus two.</think>It is 4.", true, r);
}

TEST(OutputParser, ChatModeIsAllContentAndDropsStrayThinkEnd) {
  const auto r = parse_whole("Hello </think>world", opts(false));
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hello world");
}

TEST(OutputParser, UnterminatedReasoningStaysReasoning) {
  const auto r = parse_whole("still thinking about </thi", opts(true));
  EXPECT_EQ(r.reasoning, "still thinking about </thi");
  EXPECT_EQ(r.content, "");
}

TEST(OutputParser, ReasoningThenToolCallSplitAtEveryByte) {
  const std::string text = "Need the weather.</think>\n\n<｜DSML｜ calls>\n" + kCallParis + "\n</｜DSML｜ calls>";
  const auto r = parse_whole(text, opts(true));
  EXPECT_EQ(r.reasoning, "Need the weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": 3})");
  expect_split_invariant(text, true, r);
}

TEST(OutputParser, ContentBeforeCallsKeepsTextAndDropsSeparator) {
  const std::string text = "Let me check.\n\n<｜DSML｜ calls>\n" + kCallParis + "\n</｜DSML｜ calls>";
  const auto r = parse_whole(text, opts(false));
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_split_invariant(text, false, r);
}

TEST(OutputParser, TwoParallelCalls) {
  const std::string text =
      "</think>\n\n<｜DSML｜ calls>\n"
      "<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"search\">\n<｜DSML｜ parameter name=\"query\" string=\"true\">Rome \"old\" town\n</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"top_k\" string=\"false\">5</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
      "</｜DSML｜ calls>";
  const auto r = parse_whole(text, opts(true));
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(J::parse(r.calls[1].arguments), J::parse(R"({"query": "Rome \"old\" town\n", "top_k": 5})"));
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  expect_split_invariant(text, true, r);
}

TEST(OutputParser, StringValuesKeepMarkupLikeText) {
  const std::string text = "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"write\">\n"
                           "<｜DSML｜ parameter name=\"body\" string=\"true\">if (a < b) { x = \"</b>\\n\"; } é😀</｜DSML｜ parameter>\n"
                           "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const auto r = parse_whole(text, opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(J::parse(r.calls[0].arguments)["body"], "if (a < b) { x = \"</b>\\n\"; } é😀");
  expect_split_invariant(text, false, r);
}

TEST(OutputParser, NonStringValues) {
  const std::string text = "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
                           "<｜DSML｜ parameter name=\"obj\" string=\"false\">{\"a\": [1, 2.5, null]}</｜DSML｜ parameter>\n"
                           "<｜DSML｜ parameter name=\"flag\" string=\"false\">true</｜DSML｜ parameter>\n"
                           "<｜DSML｜ parameter name=\"bad\" string=\"false\">not json</｜DSML｜ parameter>\n"
                           "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const auto r = parse_whole(text, opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  const auto args = J::parse(r.calls[0].arguments);
  EXPECT_EQ(args["obj"], J::parse(R"({"a": [1, 2.5, null]})"));
  EXPECT_EQ(args["flag"], true);
  EXPECT_EQ(args["bad"], "not json");  // invalid JSON falls back to a string
}

TEST(OutputParser, NoParametersGivesEmptyObject) {
  const auto r = parse_whole("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"now\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(OutputParser, JsonObjectAsInvokeBody) {
  const auto r = parse_whole("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">{\"x\": 1}</｜DSML｜ invoke>\n</｜DSML｜ calls>", opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(J::parse(r.calls[0].arguments), J::parse(R"({"x": 1})"));
}

TEST(OutputParser, AsciiBarsAndBareInvoke) {
  const auto a = parse_whole("<|DSML| calls>\n<|DSML| invoke name=\"f\">\n<|DSML| parameter name=\"k\" string=\"true\">v</|DSML| parameter>\n</|DSML| invoke>\n</|DSML| calls>", opts(false));
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"k": "v"})");
  const auto b = parse_whole("Sure.\n\n" + kCallParis, opts(false));
  EXPECT_EQ(b.content, "Sure.");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].name, "get_weather");
}

TEST(OutputParser, MalformedMarkupDegradesToContent) {
  // not a call at all after the opener
  const std::string t1 = "<｜DSML｜ calls>\nI cannot do that.";
  auto r = parse_whole(t1, opts(false));
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, t1);
  for (size_t cut = 0; cut <= t1.size(); ++cut)
    EXPECT_EQ(parse_chunks({t1.substr(0, cut), t1.substr(cut)}, opts(false)).content, t1) << cut;
  // invoke without a name
  const std::string t2 = "<｜DSML｜ calls>\n<｜DSML｜ invoke nom=\"x\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  r = parse_whole(t2, opts(false));
  EXPECT_TRUE(r.calls.empty());
  EXPECT_NE(r.content.find("invoke nom=\"x\""), std::string::npos);
  // garbage between parameters: the call is closed, the rest is text
  const std::string t3 = "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ parameter>\noops";
  r = parse_whole(t3, opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a": "1"})");
  EXPECT_EQ(r.content, "oops");
  // a duplicate parameter name keeps the first value
  r = parse_whole("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ parameter>\n"
                  "<｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
                  opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"a": "1"})");
}

TEST(OutputParser, TruncatedCallIsClosedWithValidJson) {
  const auto r = parse_whole("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">partial va", opts(false));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(J::parse(r.calls[0].arguments)["a"], "partial va");
  // a block cut inside a tag is swallowed, not shown
  const auto s = parse_whole("Text\n\n<｜DSML｜ calls>\n<｜DSML｜ inv", opts(false));
  EXPECT_EQ(s.content, "Text");
  EXPECT_TRUE(s.calls.empty());
}

TEST(OutputParser, ToolsNotOfferedSuppressesMarkup) {
  std::vector<OutputEvent> events;
  const auto r = parse_chunks({"Answer.\n\n<｜DSML｜ calls>\n" + kCallParis + "\n</｜DSML｜ calls>"}, opts(false, false), &events);
  EXPECT_EQ(r.content, "Answer.");
  EXPECT_TRUE(r.calls.empty());
  for (const auto& e : events) EXPECT_TRUE(e.kind == OutputEvent::Kind::Content);
}

TEST(OutputParser, SplitUtf8IsReassembled) {
  const std::string s = "caf\xC3\xA9 \xF0\x9F\x98\x80";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    std::vector<OutputEvent> events;
    const auto r = parse_chunks({s.substr(0, cut), s.substr(cut)}, opts(false), &events);
    EXPECT_EQ(r.content, s);
    for (const auto& e : events) EXPECT_TRUE(utf8::is_valid(e.text));
  }
}

TEST(StopStrings, MatchedAcrossChunksAndHeldBack) {
  StopStringMatcher m({"STOP", "\n\n"});
  bool stopped = false;
  std::string out = m.feed("Hello ST", &stopped);
  EXPECT_EQ(out, "Hello ");  // "ST" may begin "STOP"
  EXPECT_FALSE(stopped);
  out = m.feed("OP and more", &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "");
  EXPECT_EQ(m.feed("ignored", &stopped), "");
  StopStringMatcher n({"STOP"});
  EXPECT_EQ(n.feed("Hello ST", &stopped), "Hello ");
  EXPECT_EQ(n.feed("ILL", &stopped), "STILL");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(n.feed("ST", &stopped), "");
  EXPECT_EQ(n.flush(), "ST");
}

TEST(GenerationStream, StopStringAcrossTokenBoundaries) {
  const Tokenizer& tok = testing::v3_tokenizer();
  const auto ids = tok.encode("The answer is 42. Observation: done");
  GenerationOptions o;
  o.stop = {"Observation:"};
  GenerationStream gs(tok, o);
  std::vector<OutputEvent> events;
  size_t pushed = 0;
  for (TokenId id : ids) {
    ++pushed;
    if (gs.push(id, events)) break;
  }
  EXPECT_LT(pushed, ids.size());
  EXPECT_EQ(gs.finish_reason(), FinishReason::Stop);
  EXPECT_EQ(rebuild(events).content, "The answer is 42. ");
}

TEST(GenerationStream, EosMaxTokensAndToolCalls) {
  const Tokenizer& tok = testing::v41_layout_tokenizer();
  const TokenId eos = tok.require_token("<｜end▁of▁sentence｜>");
  {
    GenerationOptions o;
    o.starts_in_reasoning = true;
    GenerationStream gs(tok, o);
    std::vector<OutputEvent> events;
    auto ids = tok.encode("Think.</think>Done.");
    ids.push_back(eos);
    ids.push_back(tok.encode("never")[0]);
    bool stopped = false;
    for (TokenId id : ids)
      if ((stopped = gs.push(id, events))) break;
    EXPECT_TRUE(stopped);
    EXPECT_EQ(gs.finish_reason(), FinishReason::Stop);
    const auto r = rebuild(events);
    EXPECT_EQ(r.reasoning, "Think.");
    EXPECT_EQ(r.content, "Done.");
    EXPECT_EQ(gs.completion_tokens(), ids.size() - 1);
    EXPECT_GT(gs.reasoning_tokens(), 0u);
  }
  {
    GenerationOptions o;
    o.max_tokens = 3;
    GenerationStream gs(tok, o);
    std::vector<OutputEvent> events;
    int n = 0;
    for (TokenId id : tok.encode("one two three four five")) {
      ++n;
      if (gs.push(id, events)) break;
    }
    EXPECT_EQ(n, 3);
    EXPECT_EQ(gs.finish_reason(), FinishReason::Length);
  }
  {
    GenerationOptions o;
    o.starts_in_reasoning = true;
    o.parse_tool_calls = true;
    GenerationStream gs(tok, o);
    std::vector<OutputEvent> events;
    auto ids = tok.encode("Need it.</think>\n\n<｜DSML｜ calls>\n" + kCallParis + "\n</｜DSML｜ calls>");
    EXPECT_NE(std::find(ids.begin(), ids.end(), tok.require_token("｜DSML｜")), ids.end());
    ids.push_back(eos);
    for (TokenId id : ids)
      if (gs.push(id, events)) break;
    EXPECT_EQ(gs.finish_reason(), FinishReason::ToolCalls);
    const auto r = rebuild(events);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(J::parse(r.calls[0].arguments), J::parse(R"({"city": "Paris", "days": 3})"));
    EXPECT_EQ(r.content, "");
  }
}

}  // namespace
}  // namespace dsv41::text
