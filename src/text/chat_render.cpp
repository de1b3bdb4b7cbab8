// The V4.1 encoder: request normalization, tool-result merging and ordering, reasoning dropping,
// per-message rendering and generation prompt (CHAT.md §2). Mirrors the reference step by step,
// including which inputs it rejects.
#include <map>

#include "dsv41/text/chat_template.h"
#include "dsv41/text/py_json.h"

namespace dsv41::text {

namespace {

using J = nlohmann::ordered_json;
using namespace markers;

[[noreturn]] void reject(const std::string& msg) { throw ChatError(msg); }

bool truthy(const J& v) {
  switch (v.type()) {
    case J::value_t::null: return false;
    case J::value_t::boolean: return v.get<bool>();
    case J::value_t::string: return !v.get_ref<const std::string&>().empty();
    case J::value_t::array:
    case J::value_t::object: return !v.empty();
    case J::value_t::number_integer: return v.get<int64_t>() != 0;
    case J::value_t::number_unsigned: return v.get<uint64_t>() != 0;
    case J::value_t::number_float: return v.get<double>() != 0.0;
    default: return false;
  }
}

const J& get(const J& o, const char* key) {
  static const J null_json;
  if (!o.is_object()) return null_json;
  auto it = o.find(key);
  return it == o.end() ? null_json : *it;
}

std::string text_of(const J& v) { return v.is_string() ? v.get<std::string>() : python_str(v); }

// ---- OpenAI messages -> encoder messages ----------------------------------------------------

J normalize_messages(const J& messages) {
  if (!messages.is_array()) reject("messages must be an array");
  J out = J::array();
  for (const auto& m0 : messages) {
    if (!m0.is_object()) reject("every message must be an object");
    J m = m0;
    const J& role = get(m, "role");
    const std::string r = role.is_string() ? role.get<std::string>() : python_str(role);
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      reject("ValueError: Invalid role: " + r);
    // Clients send the reasoning of earlier turns as reasoning_content (DeepSeek, SGLang) or
    // reasoning (vLLM); the first present one wins.
    if (get(m, "reasoning_content").is_null() && m.contains("reasoning")) m["reasoning_content"] = m["reasoning"];
    const J& content = get(m, "content");
    if (content.is_array()) {
      std::string joined;
      bool first = true;
      for (const auto& part : content) {
        const J& type = get(part, "type");
        const std::string t = type.is_string() ? type.get<std::string>() : python_str(type);
        if (t == "text") {
          const J& text = get(part, "text");
          if (!text.is_string()) reject("a text content part needs a string \"text\"");
          if (!first) joined += "\n\n";
          joined += text.get<std::string>();
        } else if (t == "image_url" || t == "input_image" || t == "image_pil" || t == "image") {
          reject("image content is not supported: this server runs the text-only model");
        } else {
          reject("ValueError: DeepSeek V4.1 supports text and image content only; got '" + t + "'");
        }
        first = false;
      }
      m["content"] = joined;
    } else if (!content.is_null() && !content.is_string()) {
      reject("message content must be a string, an array of content parts or null");
    }
    out.push_back(std::move(m));
  }
  return out;
}

// Tool messages become tool_result blocks of a user turn; consecutive user turns merge.
J merge_tool_messages(const J& messages) {
  J merged = J::array();
  for (const auto& msg : messages) {
    const std::string role = get(msg, "role").get<std::string>();
    auto last_is_user_with_blocks = [&] {
      return !merged.empty() && get(merged.back(), "role") == "user" && merged.back().contains("content_blocks");
    };
    if (role == "tool") {
      J block = {{"type", "tool_result"},
                 {"tool_use_id", msg.contains("tool_call_id") ? msg["tool_call_id"] : J("")},
                 {"content", msg.contains("content") ? msg["content"] : J("")}};
      if (last_is_user_with_blocks()) merged.back()["content_blocks"].push_back(std::move(block));
      else merged.push_back({{"role", "user"}, {"content_blocks", J::array({std::move(block)})}});
    } else if (role == "user") {
      J blocks = J::array({{{"type", "text"}, {"text", msg.contains("content") ? msg["content"] : J("")}}});
      if (last_is_user_with_blocks() && get(merged.back(), "task").is_null()) {
        for (auto& b : blocks) merged.back()["content_blocks"].push_back(std::move(b));
      } else {
        J m = msg;
        m["content_blocks"] = std::move(blocks);
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

// Tool results follow the order of the calls in the preceding assistant message.
void sort_tool_results(J& messages) {
  std::map<std::string, int> order;
  for (auto& msg : messages) {
    const std::string role = get(msg, "role").get<std::string>();
    if (role == "assistant" && truthy(get(msg, "tool_calls"))) {
      order.clear();
      int idx = 0;
      for (const auto& tc : msg["tool_calls"]) {
        J id = get(tc, "id");
        if (!truthy(id)) id = get(get(tc, "function"), "id");
        if (truthy(id)) order[text_of(id)] = idx;
        ++idx;
      }
    } else if (role == "user" && truthy(get(msg, "content_blocks"))) {
      auto& blocks = msg["content_blocks"];
      std::vector<J> tool_blocks;
      for (const auto& b : blocks)
        if (get(b, "type") == "tool_result") tool_blocks.push_back(b);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const J& b) {
          const J& id = get(b, "tool_use_id");
          auto it = id.is_null() ? order.end() : order.find(text_of(id));
          return it == order.end() ? 0 : it->second;  // unknown ids sort first
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const J& a, const J& b) { return key(a) < key(b); });
        size_t k = 0;
        for (auto& b : blocks)
          if (get(b, "type") == "tool_result") b = tool_blocks[k++];
      }
    }
  }
}

int find_last_user_index(const J& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const J& role = get(messages[static_cast<size_t>(i)], "role");
    if (role == "user" || role == "developer" || (role == "system" && i > 0)) return i;
  }
  return -1;
}

J drop_thinking_messages(const J& messages) {
  const int last_user = find_last_user_index(messages);
  J out = J::array();
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const J& msg = messages[static_cast<size_t>(i)];
    const std::string role = get(msg, "role").get<std::string>();
    if (role == "user" || role == "system" || role == "tool" || role == "latest_reminder" || i >= last_user) {
      out.push_back(msg);
    } else if (role == "assistant") {
      J m = msg;
      m.erase("reasoning_content");
      out.push_back(std::move(m));
    }  // developer messages before the last user turn are dropped
  }
  return out;
}

// ---- rendering --------------------------------------------------------------------------------

std::string render_tools(const J& tools) {
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    const J& t = tools[i];
    if (!t.is_object() || !t.contains("function")) reject("KeyError: 'function' (every tool needs a \"function\" object)");
    if (i) schemas += "\n";
    schemas += python_json_dumps(t["function"]);
  }
  const std::string d(kDsml);
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
         "writing a \"<" + d + " calls>\" block like the following:\n\n"
         "<" + d + " calls>\n"
         "<" + d + " invoke name=\"$TOOL_NAME\">\n"
         "<" + d + " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + " parameter>\n"
         "...\n"
         "</" + d + " invoke>\n"
         "<" + d + " invoke name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</" + d + " invoke>\n"
         "</" + d + " calls>\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n" + schemas + "\n\n"
         "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

std::string render_response_format(const J& rf) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" + python_json_dumps(rf);
}

// Arguments as an object: a JSON string is decoded (twice for double encoding); anything that
// is still not an object is wrapped as {"arguments": original}.
J arguments_object(const J& original) {
  J args = original;
  if (!args.is_object()) {
    for (int k = 0; k < 2 && args.is_string(); ++k) {
      J parsed = J::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) break;
      args = std::move(parsed);
    }
    if (!args.is_object()) args = J{{"arguments", original}};
  }
  return args;
}

std::string render_tool_calls(const J& tool_calls) {
  const std::string d(kDsml);
  std::string invokes;
  bool first_call = true;
  for (const auto& tc : tool_calls) {
    const J& fn = get(tc, "function");
    if (!fn.is_object() || !fn.contains("name") || !fn.contains("arguments"))
      reject("KeyError: a tool call needs function.name and function.arguments");
    std::string params;
    bool first_param = true;
    const J args = arguments_object(fn["arguments"]);
    for (const auto& [key, value] : args.items()) {
      if (!first_param) params += "\n";
      first_param = false;
      const bool is_str = value.is_string();
      params += "<" + d + " parameter name=\"" + key + "\" string=\"" + (is_str ? "true" : "false") + "\">" +
                (is_str ? value.get<std::string>() : python_json_dumps(value)) + "</" + d + " parameter>";
    }
    if (!first_call) invokes += "\n";
    first_call = false;
    invokes += "<" + d + " invoke name=\"" + text_of(fn["name"]) + "\">\n" + params + "\n</" + d + " invoke>";
  }
  return "\n\n<" + d + " calls>\n" + invokes + "\n</" + d + " calls>";
}

std::string render_user_blocks(const J& blocks) {
  std::string out;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const J& b = blocks[i];
    const std::string type = text_of(get(b, "type"));
    std::string part;
    if (type == "text") {
      const J& text = b.contains("text") ? b["text"] : J("");
      if (!text.is_string())
        reject("TypeError: sequence item " + std::to_string(i) + ": expected str instance, " +
               (text.is_null() ? "NoneType" : "non-string") + " found (a user message needs content)");
      part = text.get<std::string>();
    } else if (type == "tool_result") {
      const J& c = b.contains("content") ? b["content"] : J("");
      if (c.is_array()) {
        bool first = true;
        for (const auto& p : c) {
          if (!first) part += "\n\n";
          first = false;
          part += get(p, "type") == "text" ? text_of(get(p, "text")) : "[Unsupported " + text_of(get(p, "type")) + "]";
        }
      } else {
        part = text_of(c);
      }
      part = "<tool_result>" + part + "</tool_result>";
    } else {
      part = "[Unsupported " + type + "]";
    }
    if (i) out += "\n\n";
    out += part;
  }
  return out;
}

struct RenderState {
  const J& messages;
  bool thinking;
  bool drop_thinking;
  const J& effort;
  bool add_generation_prompt;
  bool continue_final_message;
};

std::string render_message(size_t index, const RenderState& st) {
  const J& msg = st.messages[index];
  const int last_user = find_last_user_index(st.messages);
  const std::string role = text_of(get(msg, "role"));
  const J& content = get(msg, "content");
  const J& tools = get(msg, "tools");
  const J& response_format = get(msg, "response_format");
  const J& tool_calls = get(msg, "tool_calls");
  const bool is_last = index + 1 == st.messages.size();
  const bool wo_eos = truthy(get(msg, "wo_eos")) || (is_last && st.continue_final_message);
  const std::string content_text = truthy(content) ? text_of(content) : "";

  const int effort = reasoning_effort_value(st.effort);  // validated for every message, as the reference does
  std::string effort_prompt;
  if (index == 0 && st.thinking)
    effort_prompt = "Reasoning Effort: " + std::to_string(effort) +
                    " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

  std::string prompt = index == 0 && (!effort_prompt.empty() || role == "system") ? std::string(kSystem) : "";
  prompt += effort_prompt;

  auto attachments = [&](std::string& out) {
    if (truthy(tools)) {
      if (!tools.is_array()) reject("tools must be an array");
      out += "\n\n" + render_tools(tools);
    }
    if (truthy(response_format)) out += "\n\n" + render_response_format(response_format);
  };

  if (role == "system") {
    if (index > 0) prompt += kSystem;
    prompt += content_text;
    attachments(prompt);
  } else if (role == "developer") {
    if (!truthy(content)) reject("AssertionError: Invalid message for role `developer`: " + python_json_dumps(msg));
    std::string dev = std::string(kUser) + content_text;
    attachments(dev);
    prompt += dev;
  } else if (role == "user") {
    prompt += kUser;
    const J& blocks = get(msg, "content_blocks");
    prompt += truthy(blocks) ? render_user_blocks(blocks) : content_text;
  } else if (role == "assistant") {
    std::string calls;
    if (truthy(tool_calls)) {
      if (!tool_calls.is_array()) reject("tool_calls must be an array");
      calls = render_tool_calls(tool_calls);
    }
    const J& rc_json = get(msg, "reasoning_content");
    const std::string rc = truthy(rc_json) ? text_of(rc_json) : "";
    std::string thinking_part;
    if (st.thinking && (!st.drop_thinking || static_cast<int>(index) > last_user)) {
      thinking_part = rc + std::string(kThinkEnd);
      // continuing a reasoning-only prefix: leave the reasoning open
      if (is_last && st.continue_final_message && !rc.empty() && content_text.empty() && calls.empty())
        thinking_part = rc;
    }
    prompt += thinking_part + content_text + calls;
    if (!wo_eos) prompt += kEos;
  } else {
    reject("NotImplementedError: Unknown role: " + role);
  }

  if (is_last && !st.add_generation_prompt) return prompt;
  if (index + 1 < st.messages.size()) {
    const J& next_role = get(st.messages[index + 1], "role");
    if (next_role != "assistant" && next_role != "latest_reminder") return prompt;
  }
  if (role == "user" || role == "developer" || (role == "system" && index > 0) ||
      (is_last && (role == "system" || role == "assistant"))) {
    prompt += kAssistant;
    const bool open = st.thinking && (!st.drop_thinking || static_cast<int>(index) >= last_user);
    prompt += open ? kThinkStart : kThinkEnd;
  }
  return prompt;
}

}  // namespace

int reasoning_effort_value(const nlohmann::ordered_json& effort) {
  if (effort.is_null()) return 75;  // "high"
  if (effort.is_number_integer() || effort.is_number_unsigned()) {
    const bool in_range = effort.is_number_unsigned() ? effort.get<uint64_t>() <= 100 && effort.get<uint64_t>() >= 1
                                                      : effort.get<int64_t>() >= 1 && effort.get<int64_t>() <= 100;
    if (in_range) return static_cast<int>(effort.get<int64_t>());
  } else if (effort.is_string()) {
    const std::string& s = effort.get_ref<const std::string&>();
    if (s == "low") return 50;
    if (s == "high") return 75;
    if (s == "max") return 100;
  }
  throw ChatError("AssertionError: Invalid reasoning effort for deepseek_v41: " + python_str(effort) +
                  ", should be int within [1,100] or ['low', 'high', 'max']");
}

bool prompt_opens_reasoning(std::string_view prompt) {
  return prompt.size() >= kThinkStart.size() && prompt.substr(prompt.size() - kThinkStart.size()) == kThinkStart;
}

std::string render_chat_prompt(const nlohmann::ordered_json& messages_in, const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& response_format, const ChatRenderOptions& opt) {
  J messages = normalize_messages(messages_in);
  if (truthy(tools) || truthy(response_format)) {
    if (truthy(tools) && !tools.is_array()) reject("tools must be an array");
    size_t at = messages.size();
    for (size_t i = 0; i < messages.size(); ++i)
      if (messages[i]["role"] == "system") {
        at = i;
        break;
      }
    if (at == messages.size()) {
      messages.insert(messages.begin(), J{{"role", "system"}, {"content", ""}});
      at = 0;
    }
    if (truthy(tools)) messages[at]["tools"] = tools;
    if (truthy(response_format)) messages[at]["response_format"] = response_format;
  }
  if (opt.continue_final_message && (messages.empty() || messages.back()["role"] != "assistant"))
    reject("ValueError: continue_final_message requires a final assistant message");

  messages = merge_tool_messages(messages);
  sort_tool_results(messages);

  bool drop = opt.drop_thinking;
  for (const auto& m : messages)
    if (truthy(get(m, "tools"))) drop = false;
  if (opt.thinking && drop) messages = drop_thinking_messages(messages);

  const RenderState st{messages, opt.thinking, drop, opt.reasoning_effort,
                       opt.add_generation_prompt && !opt.continue_final_message, opt.continue_final_message};
  std::string prompt(kBos);
  for (size_t i = 0; i < messages.size(); ++i) prompt += render_message(i, st);
  return prompt;
}

}  // namespace dsv41::text
