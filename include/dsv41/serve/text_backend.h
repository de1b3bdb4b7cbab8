// What the API needs from the text side (tokenizer, chat renderer, output parser), behind one
// interface so the server does not depend on how those are built: production wires the project's
// tokenizer/encoder/parsers in; tests may wire a small byte-level vocabulary.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv41::serve {

// One tool call as parsed from the model output (DSML), OpenAI-shaped.
struct ToolCallDelta {
  int index = 0;
  std::string id;          // set on the first delta of a call
  std::string name;        // set on the first delta of a call
  std::string arguments;   // fragment; fragments of one call concatenate to its JSON arguments
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Incremental parser over decoded output text (CHAT.md §3.5). Holds back tails that may be the
// start of a marker until resolved.
class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual ParsedDelta feed(std::string_view text) = 0;
  virtual ParsedDelta finish() = 0;  // end of output: flush what was held back
};

struct ChatPrompt {
  std::vector<int32_t> ids;
  bool thinking = false;   // the prompt ends in <think>: output starts with reasoning
};

class TextBackend {
 public:
  virtual ~TextBackend() = default;
  // Plain text to ids (no BOS/EOS added).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Raw bytes of one token (byte-level decoding; may be part of a UTF-8 sequence).
  virtual std::string token_bytes(int32_t id) const = 0;
  // Renders an OpenAI chat request (messages, tools, thinking knobs, ...) to prompt ids. Throws
  // dsv41::Error with a client-facing message for a request it cannot render (-> HTTP 400).
  virtual ChatPrompt render_chat(const nlohmann::ordered_json& request) const = 0;
  // A parser for one choice's output. `parse_tools` false: tool markup is not turned into calls.
  virtual std::unique_ptr<OutputParser> new_parser(bool thinking, bool parse_tools) const = 0;
};

}  // namespace dsv41::serve
