// DeepSeek-V4.1 prompt encoding (CHAT.md §2): OpenAI-style messages -> the prompt string the
// release's encoder produces, byte for byte. Invalid requests throw ChatError (HTTP 400); the
// messages mirror the reference's exceptions ("AssertionError: Invalid reasoning effort ...").
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "dsv41/common/error.h"

namespace dsv41::text {

class ChatError : public Error {
 public:
  using Error::Error;
};

// Marker strings of the V4.1 format. Ids must always be looked up by text in the tokenizer in use.
namespace markers {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";
}  // namespace markers

struct ChatRenderOptions {
  bool thinking = true;                      // thinking mode (default) or chat mode
  nlohmann::ordered_json reasoning_effort;   // null = "high"; "low" | "high" | "max" | integer 1..100
  bool drop_thinking = true;                 // drop old reasoning (off automatically with tools)
  bool add_generation_prompt = true;
  bool continue_final_message = false;       // leave the last assistant message open
};

// Renders `messages` (OpenAI chat messages: system/developer/user/assistant/tool, string or
// content-part content). Request-level `tools` (OpenAI function tools) and `response_format`
// attach to the first system message; an empty one is inserted at index 0 when there is none.
// Pass null for absent tools/response_format.
std::string render_chat_prompt(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& response_format, const ChatRenderOptions& options);

// The numeric effort the encoder renders for an effort value (throws ChatError when invalid).
int reasoning_effort_value(const nlohmann::ordered_json& effort);

// True when generation starts inside reasoning (the prompt ends with "<think>").
bool prompt_opens_reasoning(std::string_view prompt);

// What an OpenAI /v1/chat/completions body asks the renderer for. Resolves the thinking switch
// (chat_template_kwargs.thinking / enable_thinking, top-level thinking {"type": "enabled" |
// "disabled"}, reasoning_effort "none"), effort aliases of the hosted API (minimal -> low,
// medium/xhigh -> high, ultra -> max; top-level or chat_template_kwargs.reasoning_effort),
// tools (dropped with tool_choice "none"), response_format (json_object / json_schema only).
struct ChatRequest {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;            // null when none
  nlohmann::ordered_json response_format;  // null when none
  ChatRenderOptions options;
  bool parse_tool_calls = false;           // tools were offered: parse DSML into tool_calls
};
ChatRequest chat_request_from_openai(const nlohmann::ordered_json& body);

}  // namespace dsv41::text
