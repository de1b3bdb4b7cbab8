// Stop strings that span a token boundary, taken from a streamed answer's pieces (one piece per
// chunk, so piece boundaries are token boundaries): the last whole character of one piece and the
// first of the next. Whatever the vocabulary produced, the stop string then straddles two tokens.
#pragma once
#include <string>
#include <vector>

namespace dsv41::test {

// Bytes in the UTF-8 character that `lead` starts; 0 for a continuation or invalid byte.
inline size_t utf8_char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// A character a stop string may hold: not a control character, not U+FFFD (the stand-in for
// bytes that are no UTF-8, which does not stand for one byte sequence).
inline bool stop_worthy(const std::string& ch) {
  if (ch.empty() || ch == "\xEF\xBF\xBD") return false;
  const auto c0 = static_cast<unsigned char>(ch[0]);
  return ch.size() > 1 || (c0 >= 0x20 && c0 != 0x7F);
}

// The first whole character of s ("" when s does not start with one worth stopping on).
inline std::string first_char(const std::string& s) {
  if (s.empty()) return {};
  const size_t n = utf8_char_length(static_cast<unsigned char>(s[0]));
  if (n == 0 || n > s.size()) return {};
  for (size_t i = 1; i < n; ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) return {};
  const std::string ch = s.substr(0, n);
  return stop_worthy(ch) ? ch : std::string();
}

// The last whole character of s ("" when s does not end with one worth stopping on).
inline std::string last_char(const std::string& s) {
  if (s.empty()) return {};
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && s.size() - i < 4) --i;
  const std::string ch = s.substr(i);
  return first_char(ch) == ch ? ch : std::string();
}

// A two-character stop string across the boundary nearest the middle of `pieces` whose two sides
// are whole printable characters; "" when no boundary qualifies.
inline std::string stop_across_boundary(const std::vector<std::string>& pieces) {
  std::vector<std::string> found;
  for (size_t k = 1; k < pieces.size(); ++k) {
    const std::string left = last_char(pieces[k - 1]), right = first_char(pieces[k]);
    if (!left.empty() && !right.empty()) found.push_back(left + right);
  }
  return found.empty() ? std::string() : found[found.size() / 2];
}

}  // namespace dsv41::test
