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

// What one choice's output is made of (OpenAI request knobs that shape the text).
struct OutputOptions {
  bool parse_markup = true;       // chat: split reasoning / content / tool calls; false: raw text
  bool thinking = false;          // the prompt ends in <think>: output starts with reasoning
  bool parse_tools = false;       // false: DSML tool markup is not turned into calls
  std::vector<std::string> stop;  // stop strings (across token boundaries)
  bool include_stop = false;      // include_stop_str_in_output
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // ids that end the output (shown as no text, counted)
};

// One choice's token -> text pipeline (bytes -> UTF-8 -> stop strings -> reasoning / content /
// tool calls), fed in the HTTP thread. Every token pushed counts as a completion token, the EOS /
// stop id that ends the output included (OpenAI and vLLM count the generated EOS).
class ChoiceOutput {
 public:
  virtual ~ChoiceOutput() = default;
  // Adds one generated token; returns what became visible. After stopped() later tokens are
  // ignored (and not counted).
  virtual ParsedDelta push(int32_t id) = 0;
  // End of generation (length, abort): flushes what was held back.
  virtual ParsedDelta finish() = 0;
  // True once a stop string, EOS or stop id ended the output.
  virtual bool stopped() const = 0;
  virtual int64_t completion_tokens() const = 0;
  virtual int64_t reasoning_tokens() const = 0;
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
  // The output pipeline of one choice.
  virtual std::unique_ptr<ChoiceOutput> new_output(const OutputOptions& options) const = 0;
};

}  // namespace dsv41::serve
