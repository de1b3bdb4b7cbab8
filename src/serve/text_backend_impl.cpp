#include "serve/text_backend_impl.h"

#include "dsv41/common/error.h"
#include "dsv41/text/chat_template.h"
#include "dsv41/text/output_parser.h"

namespace dsv41::serve {

std::vector<int32_t> TokenizerTextBackend::encode(std::string_view text) const {
  // Raw completion prompts may carry markers on purpose: added tokens are matched (vLLM parity).
  return tok_.encode(text, true);
}

std::string TokenizerTextBackend::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tok_.vocab_size()) return {};  // model ids past the tokenizer: no text
  return tok_.token_bytes(id);
}

ChatPrompt TokenizerTextBackend::render_chat(const nlohmann::ordered_json& request) const {
  // ChatError (a dsv41::Error) carries the client-facing reason; the API turns it into a 400.
  const text::ChatRequest req = text::chat_request_from_openai(request);
  const std::string prompt = text::render_chat_prompt(req.messages, req.tools, req.response_format, req.options);
  ChatPrompt out;
  // The rendered prompt is encoded as one string with marker matching (vLLM/SGLang parity).
  out.ids = tok_.encode(prompt, true);
  out.thinking = text::prompt_opens_reasoning(prompt);
  return out;
}

namespace {

// The project's DSML/reasoning parser (dsv41::text::OutputParser) behind the API's interface.
class DsmlParser : public OutputParser {
 public:
  DsmlParser(bool thinking, bool parse_tools) : p_(options(thinking, parse_tools)) {}
  ParsedDelta feed(std::string_view text) override {
    events_.clear();
    p_.feed(text, events_);
    return convert();
  }
  ParsedDelta finish() override {
    events_.clear();
    p_.finish(events_);
    return convert();
  }

 private:
  static text::OutputParserOptions options(bool thinking, bool parse_tools) {
    text::OutputParserOptions o;
    o.starts_in_reasoning = thinking;
    o.parse_tool_calls = parse_tools;
    return o;
  }
  ParsedDelta convert() {
    ParsedDelta d;
    for (auto& e : events_) {
      switch (e.kind) {
        case text::OutputEvent::Kind::Reasoning: d.reasoning += e.text; break;
        case text::OutputEvent::Kind::Content: d.content += e.text; break;
        case text::OutputEvent::Kind::ToolCallStart: {
          ToolCallDelta t;
          t.index = e.index;
          t.id = e.id;
          t.name = e.name;
          d.tool_calls.push_back(std::move(t));
          break;
        }
        case text::OutputEvent::Kind::ToolCallArguments:
          if (!d.tool_calls.empty() && d.tool_calls.back().index == e.index) {
            d.tool_calls.back().arguments += e.text;
          } else {
            ToolCallDelta t;
            t.index = e.index;
            t.arguments = e.text;
            d.tool_calls.push_back(std::move(t));
          }
          break;
        case text::OutputEvent::Kind::ToolCallEnd: break;
      }
    }
    return d;
  }
  text::OutputParser p_;
  std::vector<text::OutputEvent> events_;
};

}  // namespace

std::unique_ptr<OutputParser> TokenizerTextBackend::new_parser(bool thinking, bool parse_tools) const {
  return std::make_unique<DsmlParser>(thinking, parse_tools);
}

std::unique_ptr<TokenizerTextBackend> make_text_backend(const std::string& tokenizer_json) {
  return std::make_unique<TokenizerTextBackend>(text::Tokenizer::from_file(tokenizer_json));
}

}  // namespace dsv41::serve
