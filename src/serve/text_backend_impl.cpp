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

// text::GenerationStream (the project's one token -> text / reasoning / tool-call pipeline)
// behind the API's interface; converts its events into the API's delta shape.
class StreamOutput : public ChoiceOutput {
 public:
  StreamOutput(const text::Tokenizer& tok, const OutputOptions& o) : gs_(tok, options(o)) {}
  ParsedDelta push(int32_t id) override {
    if (gs_.finished()) return {};
    events_.clear();
    gs_.push(id, events_);
    return convert();
  }
  ParsedDelta finish() override {
    events_.clear();
    gs_.finish(text::FinishReason::Length, events_);
    return convert();
  }
  bool stopped() const override { return gs_.finished(); }
  int64_t completion_tokens() const override { return static_cast<int64_t>(gs_.completion_tokens()); }
  int64_t reasoning_tokens() const override { return static_cast<int64_t>(gs_.reasoning_tokens()); }

 private:
  static text::GenerationOptions options(const OutputOptions& o) {
    text::GenerationOptions g;
    g.parse_output = o.parse_markup;
    g.starts_in_reasoning = o.thinking;
    g.parse_tool_calls = o.parse_tools;
    g.stop = o.stop;
    g.include_stop_str_in_output = o.include_stop;
    g.ignore_eos = o.ignore_eos;
    g.stop_token_ids.assign(o.stop_token_ids.begin(), o.stop_token_ids.end());
    return g;  // max_tokens stays 0: the scheduler ends the sequence at the limit
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
  text::GenerationStream gs_;
  std::vector<text::OutputEvent> events_;
};

}  // namespace

std::unique_ptr<ChoiceOutput> TokenizerTextBackend::new_output(const OutputOptions& options) const {
  return std::make_unique<StreamOutput>(tok_, options);
}

std::unique_ptr<TokenizerTextBackend> make_text_backend(const std::string& tokenizer_json) {
  return std::make_unique<TokenizerTextBackend>(text::Tokenizer::from_file(tokenizer_json));
}

}  // namespace dsv41::serve
