#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include "dsv41/common/error.h"

namespace dsv41::text {

namespace {

// Unicode White_Space, written for a PCRE2 character class.
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

pcre2_match_data* thread_match_data() {
  thread_local MatchData data;
  return data.md;
}

}  // namespace

std::string rewrite_whitespace_classes(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        if (in_class) {
          out += kWhiteSpace;
        } else {
          out += '[';
          out += kWhiteSpace;
          out += ']';
        }
        i += 2;
      } else if (n == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpace;
        out += ']';
        i += 2;
      } else if (n == 'Q') {  // quoted run: copy verbatim up to \E
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
      } else {
        out += c;
        out += n;
        i += 2;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:name:]
      const size_t end = p.find(":]", i + 2);
      const size_t stop = end == std::string_view::npos ? i + 1 : end + 2;
      out.append(p.substr(i, stop - i));
      i = stop;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

Regex::Regex(std::string_view pattern, bool literal) : source_(pattern) {
  const std::string compiled = literal ? std::string(pattern) : rewrite_whitespace_classes(pattern);
  // PCRE2_LITERAL allows UTF but not UCP/MULTILINE (they mean nothing for a plain string).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : (PCRE2_UCP | PCRE2_MULTILINE));
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), options, &err,
                                   &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    fail("cannot compile regex '{}': {} at offset {}", source_, reinterpret_cast<const char*>(buf), err_off);
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::Regex(Regex&& o) noexcept : source_(std::move(o.source_)), code_(o.code_), jit_(o.jit_) { o.code_ = nullptr; }

Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
    source_ = std::move(o.source_);
    code_ = o.code_;
    jit_ = o.jit_;
    o.code_ = nullptr;
  }
  return *this;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::find(std::string_view subject, size_t start, size_t& match_begin, size_t& match_end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = thread_match_data();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code, s, subject.size(), start, 0, md, nullptr)
                : pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof buf);
    fail("regex '{}' failed: {}", source_, reinterpret_cast<const char*>(buf));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  match_begin = ov[0];
  match_end = ov[1];
  return true;
}

}  // namespace dsv41::text
