// OpenAI /v1/chat/completions body -> renderer inputs (CHAT.md §2.1, §2.4).
#include "dsv41/text/chat_template.h"
#include "dsv41/text/py_json.h"

namespace dsv41::text {

namespace {

using J = nlohmann::ordered_json;

const J& member(const J& o, const char* key) {
  static const J null_json;
  if (!o.is_object()) return null_json;
  auto it = o.find(key);
  return it == o.end() ? null_json : *it;
}

bool as_switch(const J& v, const char* name) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_null()) return false;
  throw ChatError(std::string(name) + " must be true or false");
}

// Hosted-API effort names -> the encoder's values; "none" is handled by the caller.
J canonical_effort(const J& e) {
  if (e.is_string()) {
    const std::string& s = e.get_ref<const std::string&>();
    if (s == "low" || s == "minimal") return "low";
    if (s == "high" || s == "medium" || s == "xhigh") return "high";
    if (s == "max" || s == "ultra") return "max";
  } else if ((e.is_number_integer() || e.is_number_unsigned()) && !e.is_boolean()) {
    const int64_t v = e.get<int64_t>();
    if (v >= 1 && v <= 100) return e;
  }
  throw ChatError("invalid reasoning_effort " + python_json_dumps(e) +
                  ": use low, high, max (or minimal, medium, xhigh, ultra), none, or an integer from 1 to 100");
}

}  // namespace

ChatRequest chat_request_from_openai(const nlohmann::ordered_json& body) {
  if (!body.is_object()) throw ChatError("the request body must be a JSON object");
  ChatRequest r;
  r.messages = member(body, "messages");
  if (!r.messages.is_array() || r.messages.empty()) throw ChatError("messages must be a non-empty array");

  const J& kwargs = member(body, "chat_template_kwargs");
  if (!kwargs.is_null() && !kwargs.is_object()) throw ChatError("chat_template_kwargs must be an object");

  // Thinking switch: on unless switched off; an explicit top-level switch beats the kwargs.
  bool thinking = true;
  if (kwargs.contains("thinking") || kwargs.contains("enable_thinking"))
    thinking = as_switch(member(kwargs, "thinking"), "chat_template_kwargs.thinking") ||
               as_switch(member(kwargs, "enable_thinking"), "chat_template_kwargs.enable_thinking");
  const J& top_thinking = member(body, "thinking");
  bool explicit_switch = false;
  if (top_thinking.is_object()) {
    const J& type = member(top_thinking, "type");
    if (type == "enabled") thinking = true;
    else if (type == "disabled") thinking = false;
    else throw ChatError("thinking.type must be \"enabled\" or \"disabled\"");
    explicit_switch = true;
  } else if (top_thinking.is_boolean()) {
    thinking = top_thinking.get<bool>();
    explicit_switch = true;
  } else if (!top_thinking.is_null()) {
    throw ChatError("thinking must be an object {\"type\": \"enabled\" | \"disabled\"}");
  }

  J effort = member(body, "reasoning_effort");
  if (!member(kwargs, "reasoning_effort").is_null()) effort = member(kwargs, "reasoning_effort");
  if (effort == "none") {
    if (!explicit_switch) thinking = false;  // an explicit thinking switch wins over the effort
    effort = nullptr;
  } else if (!effort.is_null()) {
    effort = canonical_effort(effort);
  }
  r.options.thinking = thinking;
  r.options.reasoning_effort = effort;
  if (kwargs.contains("drop_thinking")) r.options.drop_thinking = as_switch(kwargs["drop_thinking"], "drop_thinking");

  const J& tools = member(body, "tools");
  const J& tool_choice = member(body, "tool_choice");
  if (!tools.is_null()) {
    if (!tools.is_array()) throw ChatError("tools must be an array");
    for (const auto& t : tools) {
      if (!t.is_object() || member(t, "type") != "function" || !member(t, "function").is_object())
        throw ChatError("only tools of type \"function\" with a \"function\" object are supported");
      if (!member(member(t, "function"), "name").is_string()) throw ChatError("every tool function needs a name");
    }
    if (!tools.empty() && tool_choice != "none") {
      r.tools = tools;
      r.parse_tool_calls = true;
    }
  }

  const J& rf = member(body, "response_format");
  if (!rf.is_null()) {
    const J& type = member(rf, "type");
    if (type == "json_object" || type == "json_schema") r.response_format = rf;
    else if (type != "text") throw ChatError("response_format.type must be text, json_object or json_schema");
  }
  return r;
}

}  // namespace dsv41::text
