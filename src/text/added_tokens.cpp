#include "text/added_tokens.h"

#include <utf8proc.h>

#include "text/utf8.h"

namespace dsv41::text {

namespace {

// Rust regex `\w` (Unicode): Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(uint32_t cp) {
  if (cp == 0x200C || cp == 0x200D || cp == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// Start of the code point that ends right before `pos` (text is valid UTF-8).
size_t previous_char_start(std::string_view text, size_t pos) {
  size_t p = pos - 1;
  while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
  return p;
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens) {
  tokens_.clear();
  edges_.clear();
  terminal_.assign(1, -1);
  for (const auto& t : tokens) {
    if (t.content.empty()) continue;
    const auto index = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(t);
    int32_t node = 0;
    for (char ch : t.content) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(ch);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        const auto child = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        it = edges_.emplace(key, child).first;
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = index;  // first of duplicate contents wins
    first_byte_[static_cast<uint8_t>(t.content[0])] = true;
  }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t end, size_t* match_end) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < end; ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) {
      best = terminal_[node];
      *match_end = i + 1;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, size_t begin, size_t end, std::vector<Segment>& out) const {
  size_t start_offset = begin;  // end of the last emitted token
  size_t pos = begin;
  while (pos < end) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t stop = 0;
    const int32_t ti = longest_at(text, pos, end, &stop);
    if (ti < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<size_t>(ti)];
    size_t start = pos;
    const size_t match_stop = stop;
    if (tok.single_word) {
      bool word_before = false, word_after = false;
      if (start > begin) {
        size_t p = previous_char_start(text, start);
        word_before = is_word_char(utf8::next_code_point(text, p));
      }
      if (stop < end) {
        size_t p = stop;
        word_after = is_word_char(utf8::next_code_point(text, p));
      }
      if (word_before || word_after) {  // rejected: the search resumes after this match
        pos = match_stop;
        continue;
      }
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > begin) {
        size_t p = previous_char_start(text, s), q = p;
        if (!utf8::is_white_space(utf8::next_code_point(text, q))) break;
        s = p;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < end) {
        size_t q = stop;
        if (!utf8::is_white_space(utf8::next_code_point(text, q))) break;
        stop = q;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
    pos = std::max(match_stop, stop);
  }
  if (start_offset < end) out.push_back({start_offset, end, -1});
}

}  // namespace dsv41::text
