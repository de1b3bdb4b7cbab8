#include "serve/choice_text.h"

#include <algorithm>

namespace dsv41::serve {

namespace {

// Byte count of the UTF-8 sequence that starts with `c` (0 = not a valid lead byte).
int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

size_t complete_utf8_prefix(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const int n = utf8_len(static_cast<unsigned char>(s[i]));
    if (n == 0) {
      ++i;
      continue;
    }
    if (i + n > s.size()) {
      // Incomplete only if what is there so far is a valid start.
      bool ok = true;
      for (size_t k = i + 1; k < s.size(); ++k) ok = ok && is_cont(static_cast<unsigned char>(s[k]));
      if (ok) return i;
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; k < n; ++k) ok = ok && is_cont(static_cast<unsigned char>(s[i + k]));
    i += ok ? n : 1;
  }
  return s.size();
}

std::string sanitize_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = utf8_len(c);
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) ok = is_cont(static_cast<unsigned char>(s[i + k]));
    // Reject overlongs / surrogates the lead-byte table lets through.
    if (ok && n == 3) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) ok = false;
    }
    if (ok && n == 4) {
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) ok = false;
    }
    if (ok) {
      out.append(s, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

ChoiceText::ChoiceText(const TextBackend& text, std::vector<std::string> stop, bool include_stop,
                       std::unique_ptr<OutputParser> parser, bool thinking)
    : text_(text), stop_(std::move(stop)), include_stop_(include_stop), parser_(std::move(parser)), thinking_(thinking) {}

ParsedDelta ChoiceText::emit(const std::string& text) {
  ParsedDelta d;
  if (text.empty()) return d;
  const std::string clean = sanitize_utf8(text);
  if (parser_) return parser_->feed(clean);
  d.content = clean;
  return d;
}

ParsedDelta ChoiceText::add(const sched::SampledToken& t) {
  if (stopped_) return {};
  ++n_tokens_;
  bytes_ += text_.token_bytes(t.id);
  const size_t n = complete_utf8_prefix(bytes_);
  std::string piece = bytes_.substr(0, n);
  bytes_.erase(0, n);
  if (thinking_ && !think_closed_) {
    raw_ += piece;
    if (raw_.find("</think>") != std::string::npos) {
      think_closed_ = true;
      reasoning_tokens_ = n_tokens_;
      raw_.clear();
    }
  }
  if (stop_.empty()) return emit(piece);

  held_ += piece;
  // Earliest stop match in the held text.
  size_t best = std::string::npos, best_len = 0;
  for (const auto& s : stop_) {
    const size_t p = held_.find(s);
    if (p != std::string::npos && (p < best || best == std::string::npos)) {
      best = p;
      best_len = s.size();
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best + (include_stop_ ? best_len : 0));
    held_.clear();
    bytes_.clear();
    ParsedDelta d = emit(out);
    return d;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stop_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return emit(out);
}

ParsedDelta ChoiceText::finish() {
  std::string rest = held_ + bytes_;
  held_.clear();
  bytes_.clear();
  ParsedDelta d = emit(rest);
  if (parser_) {
    ParsedDelta f = parser_->finish();
    d.reasoning += f.reasoning;
    d.content += f.content;
    for (auto& c : f.tool_calls) d.tool_calls.push_back(std::move(c));
  }
  return d;
}

}  // namespace dsv41::serve
