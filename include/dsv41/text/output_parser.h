// Streaming parsers for DeepSeek-V4.1 output (CHAT.md §3): reasoning vs content split at
// </think>, DSML tool calls -> OpenAI tool_calls, stop strings across token boundaries, and
// GenerationStream, which ties token ids -> text -> stop strings -> events together for the server.
//
// Feeding is incremental: any tail that may be the start of a marker (`</think>`,
// `\n\n<｜DSML｜ calls>`, closing tags, a stop string) is held back until resolved, so markup never
// leaks into content. Malformed markup is emitted as plain content.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dsv41/text/tokenizer.h"

namespace dsv41::text {

struct OutputEvent {
  enum class Kind {
    Reasoning,          // text: reasoning delta
    Content,            // text: content delta
    ToolCallStart,      // index, id, name (arguments follow as ToolCallArguments)
    ToolCallArguments,  // index, text: next fragment of the arguments JSON string
    ToolCallEnd,        // index: the arguments are complete, valid JSON
  };
  Kind kind = Kind::Content;
  std::string text;
  int index = -1;
  std::string id;
  std::string name;
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
};

struct OutputParserOptions {
  bool starts_in_reasoning = false;  // the prompt ended with <think> (prompt_opens_reasoning)
  bool parse_tool_calls = true;      // false (no tools / tool_choice "none"): DSML blocks are dropped
  std::function<std::string()> make_call_id;  // default: "call_" + 24 random hex digits
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  // Appends the events that `text` resolves. Text may be split anywhere, even inside a UTF-8
  // character (an incomplete trailing character waits for the next call).
  void feed(std::string_view text, std::vector<OutputEvent>& events);
  // End of output: flushes held text; an unterminated tool call is closed with valid JSON.
  void finish(std::vector<OutputEvent>& events);

  // Totals so far (what a non-streaming response returns).
  const std::string& reasoning() const;
  const std::string& content() const;
  const std::vector<ToolCall>& tool_calls() const;
  bool in_reasoning() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Holds back text that could be the start of a stop string; reports the first full match.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop_string = false);
  // Returns the text that is safe to pass on. Once a stop string completes, *stopped becomes true
  // and the text up to it (or through it with include_stop_string) is returned; the rest is dropped.
  std::string feed(std::string_view text, bool* stopped);
  std::string flush();  // end of output: whatever is still held
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  bool include_;
  bool stopped_ = false;
  std::string held_;
};

enum class FinishReason { None, Stop, Length, ToolCalls };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "tool_calls" (None -> "")

struct GenerationOptions {
  bool starts_in_reasoning = false;
  bool parse_tool_calls = false;
  std::vector<std::string> stop;          // user stop strings (applied to the generated text)
  bool include_stop_str_in_output = false;
  size_t max_tokens = 0;                  // 0 = no limit
  bool ignore_eos = false;
  std::vector<TokenId> stop_token_ids;    // extra ids that end generation (not shown)
  std::function<std::string()> make_call_id;
  // false: plain completion text, no reasoning/tool-call markup parsing (everything is Content).
  bool parse_output = true;
};

// One request's output path: ids -> StreamDecoder -> StopStringMatcher -> OutputParser.
// EOS is resolved by text ("<｜end▁of▁sentence｜>") in the tokenizer in use. Stop strings apply to
// all generated text (reasoning included), as vLLM does. Every pushed token counts in
// completion_tokens(), the EOS / stop id that ends generation included (it is generated, as vLLM
// and OpenAI count it); ids past the tokenizer's vocabulary (a padded model vocabulary) count but
// have no text. Not thread-safe: one per request.
class GenerationStream {
 public:
  GenerationStream(const Tokenizer& tokenizer, GenerationOptions options);
  // Feeds one sampled token, appends the events it resolves; returns true when generation must
  // stop now (EOS, stop id, stop string, max_tokens). Calls after that are ignored.
  bool push(TokenId id, std::vector<OutputEvent>& events);
  // Ends generation for a reason the caller knows (context full -> Length, abort -> Stop).
  void finish(FinishReason reason, std::vector<OutputEvent>& events);

  bool finished() const { return finish_reason_ != FinishReason::None; }
  // Stop becomes ToolCalls when at least one tool call was parsed.
  FinishReason finish_reason() const { return finish_reason_; }
  size_t completion_tokens() const { return completion_tokens_; }
  size_t reasoning_tokens() const { return reasoning_tokens_; }  // tokens fed while in reasoning
  const OutputParser& parser() const { return parser_; }

 private:
  void deliver(const std::string& text, std::vector<OutputEvent>& events);

  GenerationOptions opt_;
  StreamDecoder decoder_;
  StopStringMatcher stop_;
  OutputParser parser_;
  TokenId eos_id_ = -1;
  size_t vocab_size_ = 0;
  size_t completion_tokens_ = 0;
  size_t reasoning_tokens_ = 0;
  FinishReason finish_reason_ = FinishReason::None;
};

}  // namespace dsv41::text
