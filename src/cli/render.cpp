// `dsv41-serve render`: stdin = JSON array of cases shaped like chat_golden.json entries
// (messages, optional tools, thinking (default true), reasoning_effort, optional response_format);
// stdout = JSON array of {"prompt": "..."} or {"error": "..."}, in the same order.
#include <iostream>
#include <iterator>

#include "cli/commands.h"
#include "dsv41/text/chat_template.h"

namespace dsv41::cli {

namespace {

using J = nlohmann::ordered_json;

J render_case(const J& c) {
  try {
    if (!c.is_object()) throw text::ChatError("a case must be an object");
    text::ChatRenderOptions opt;
    if (c.contains("thinking")) {
      if (!c["thinking"].is_boolean()) throw text::ChatError("thinking must be true or false");
      opt.thinking = c["thinking"].get<bool>();
    }
    if (c.contains("reasoning_effort")) opt.reasoning_effort = c["reasoning_effort"];
    if (c.contains("drop_thinking") && c["drop_thinking"].is_boolean()) opt.drop_thinking = c["drop_thinking"].get<bool>();
    if (c.contains("add_generation_prompt") && c["add_generation_prompt"].is_boolean())
      opt.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    const J messages = c.contains("messages") ? c["messages"] : J();
    const J tools = c.contains("tools") ? c["tools"] : J();
    const J response_format = c.contains("response_format") ? c["response_format"] : J();
    return J{{"prompt", text::render_chat_prompt(messages, tools, response_format, opt)}};
  } catch (const Error& e) {
    return J{{"error", e.what()}};
  }
}

}  // namespace

Command add_render(CLI::App& root) {
  auto* app = root.add_subcommand("render", "Render chat requests (JSON array on stdin) into DeepSeek-V4.1 prompts");
  return {app, [] {
            const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
            J cases = J::parse(input, nullptr, /*allow_exceptions=*/false);
            if (cases.is_discarded() || !cases.is_array()) fail("render: stdin must be a JSON array of cases");
            J out = J::array();
            for (const auto& c : cases) out.push_back(render_case(c));
            std::cout << out.dump(-1, ' ', false, J::error_handler_t::replace) << "\n";
            return 0;
          }};
}

}  // namespace dsv41::cli
