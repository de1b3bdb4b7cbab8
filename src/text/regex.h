// PCRE2 (UTF + UCP, JIT) wrapper with the regex dialect of HF `tokenizers` (Oniguruma, Ruby
// syntax): `\s`/`\S` mean the Unicode White_Space property (PCRE2's `\s` also takes U+180E), and
// `^`/`$` are line anchors.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace dsv41::text {

class Regex {
 public:
  // literal=true matches `pattern` as a plain string. Throws dsv41::Error with PCRE2's message.
  Regex(std::string_view pattern, bool literal = false);
  Regex(Regex&& o) noexcept;
  Regex& operator=(Regex&& o) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();

  // Finds the first match in subject at or after byte `start`; subject must be valid UTF-8
  // (not re-checked). Returns false when there is none.
  bool find(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const;

  const std::string& pattern() const { return source_; }

 private:
  std::string source_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Rewrites `\s` and `\S` into explicit White_Space classes (exposed for tests).
std::string rewrite_whitespace_classes(std::string_view pattern);

}  // namespace dsv41::text
