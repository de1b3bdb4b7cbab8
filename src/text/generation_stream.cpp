#include "dsv41/text/chat_template.h"
#include "dsv41/text/output_parser.h"

namespace dsv41::text {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop_string)
    : include_(include_stop_string) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringMatcher::feed(std::string_view text, bool* stopped) {
  *stopped = stopped_;
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  size_t best = std::string::npos, best_len = 0;
  for (const auto& s : stops_) {
    const size_t p = held_.find(s);
    if (p != std::string::npos && (p < best || (p == best && s.size() > best_len))) {
      best = p;
      best_len = s.size();
    }
  }
  if (best != std::string::npos) {
    stopped_ = *stopped = true;
    std::string out = held_.substr(0, best + (include_ ? best_len : 0));
    held_.clear();
    return out;
  }
  // Hold the longest tail that could still grow into a stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(held_.size(), s.size() - 1); k > hold; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::ToolCalls: return "tool_calls";
    case FinishReason::None: break;
  }
  return "";
}

namespace {
OutputParserOptions parser_options(const GenerationOptions& o) {
  OutputParserOptions p;
  p.starts_in_reasoning = o.starts_in_reasoning && o.parse_output;
  p.parse_tool_calls = o.parse_tool_calls;
  p.make_call_id = o.make_call_id;
  return p;
}
}  // namespace

GenerationStream::GenerationStream(const Tokenizer& tokenizer, GenerationOptions options)
    : opt_(std::move(options)),
      decoder_(tokenizer),
      stop_(opt_.stop, opt_.include_stop_str_in_output),
      parser_(parser_options(opt_)) {
  eos_id_ = tokenizer.token_to_id(markers::kEos).value_or(-1);
  vocab_size_ = tokenizer.vocab_size();
}

void GenerationStream::deliver(const std::string& text, std::vector<OutputEvent>& events) {
  if (opt_.parse_output) {
    parser_.feed(text, events);
  } else if (!text.empty()) {
    OutputEvent e;
    e.kind = OutputEvent::Kind::Content;
    e.text = text;
    events.push_back(std::move(e));
  }
}

bool GenerationStream::push(TokenId id, std::vector<OutputEvent>& events) {
  if (finished()) return true;
  ++completion_tokens_;
  if (parser_.in_reasoning()) ++reasoning_tokens_;
  const bool is_eos = id == eos_id_ && !opt_.ignore_eos;
  bool is_stop_id = false;
  for (TokenId s : opt_.stop_token_ids) is_stop_id |= s == id;
  if (is_eos || is_stop_id) {  // the stop token itself is not shown
    finish(FinishReason::Stop, events);
    return true;
  }
  bool stopped = false;
  const bool has_text = id >= 0 && static_cast<size_t>(id) < vocab_size_;
  deliver(stop_.feed(has_text ? decoder_.push(id) : std::string(), &stopped), events);
  if (stopped) {
    finish(FinishReason::Stop, events);
    return true;
  }
  if (opt_.max_tokens && completion_tokens_ >= opt_.max_tokens) {
    finish(FinishReason::Length, events);
    return true;
  }
  return false;
}

void GenerationStream::finish(FinishReason reason, std::vector<OutputEvent>& events) {
  if (finished()) return;
  bool stopped = false;
  std::string tail = stop_.feed(decoder_.finish(), &stopped);
  if (!stopped) tail += stop_.flush();
  else reason = FinishReason::Stop;
  deliver(tail, events);
  if (opt_.parse_output) parser_.finish(events);
  if (reason == FinishReason::None) reason = FinishReason::Stop;
  if (reason == FinishReason::Stop && !parser_.tool_calls().empty()) reason = FinishReason::ToolCalls;
  finish_reason_ = reason;
}

}  // namespace dsv41::text
