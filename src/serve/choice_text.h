// Per-choice output pipeline in the HTTP thread: token bytes -> complete UTF-8 -> stop strings
// (held back while a tail may still become one, across token boundaries) -> chat output parser
// (reasoning / content / tool calls). Also counts reasoning tokens.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dsv41/serve/text_backend.h"
#include "sched/sampling.h"

namespace dsv41::serve {

class ChoiceText {
 public:
  // parser may be null (plain completions: everything is content).
  ChoiceText(const TextBackend& text, std::vector<std::string> stop, bool include_stop,
             std::unique_ptr<OutputParser> parser, bool thinking);

  // Adds one generated token; returns what became visible. Once a stop string matched,
  // stopped() is true and later tokens are ignored.
  ParsedDelta add(const sched::SampledToken& t);
  // End of generation: flushes held-back text and the parser.
  ParsedDelta finish();

  bool stopped() const { return stopped_; }
  int64_t tokens() const { return n_tokens_; }           // tokens that count for this choice
  int64_t reasoning_tokens() const { return thinking_ ? (think_closed_ ? reasoning_tokens_ : n_tokens_) : 0; }

 private:
  ParsedDelta emit(const std::string& text);

  const TextBackend& text_;
  std::vector<std::string> stop_;
  bool include_stop_;
  std::unique_ptr<OutputParser> parser_;
  bool thinking_;
  std::string bytes_;   // decoded bytes not yet valid UTF-8 (an incomplete tail)
  std::string held_;    // valid text held back because it may start a stop string
  std::string raw_;     // all text so far (for the reasoning-token count)
  bool stopped_ = false;
  bool think_closed_ = false;
  int64_t n_tokens_ = 0, reasoning_tokens_ = 0;
};

// Length of the longest prefix of `s` that is complete UTF-8 (an invalid byte counts as complete:
// it becomes U+FFFD).
size_t complete_utf8_prefix(const std::string& s);
// Replaces invalid UTF-8 with U+FFFD so that the text is valid JSON.
std::string sanitize_utf8(const std::string& s);

}  // namespace dsv41::serve
