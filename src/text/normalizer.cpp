#include "text/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "dsv41/common/error.h"
#include "text/utf8.h"

namespace dsv41::text {

std::string unicode_normalize(std::string_view s, Normalizer::Kind form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Normalizer::Kind::NFC: options |= UTF8PROC_COMPOSE; break;
    case Normalizer::Kind::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case Normalizer::Kind::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Normalizer::Kind::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    default: DSV_ASSERT(false, "not a normalization form");
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) fail("Unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const uint32_t cp = utf8::next_code_point(s, i);
    if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping (SpecialCasing)
      out += "i\xCC\x87";
      continue;
    }
    utf8::append(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string strip_accents(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t begin = i;
    const uint32_t cp = utf8::next_code_point(s, i);
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) continue;
    out.append(s.substr(begin, i - begin));
  }
  return out;
}

std::string strip_white_space(std::string_view s, bool left, bool right) {
  size_t begin = 0, end = s.size();
  if (left) {
    size_t i = 0;
    while (i < s.size()) {
      const size_t at = i;
      if (!utf8::is_white_space(utf8::next_code_point(s, i))) {
        begin = at;
        break;
      }
      begin = i;
    }
  }
  if (right) {
    size_t i = begin, last_end = begin;
    while (i < end) {
      if (!utf8::is_white_space(utf8::next_code_point(s, i))) last_end = i;
    }
    end = last_end;
  }
  return std::string(s.substr(begin, end - begin));
}

std::string replace_all(std::string_view s, const Regex& pattern, std::string_view content) {
  std::string out;
  size_t pos = 0, copied = 0, mb = 0, me = 0;
  while (pos <= s.size() && pattern.find(s, pos, mb, me)) {
    out.append(s.substr(copied, mb - copied));
    out.append(content);
    copied = me;
    if (me == mb) {  // empty match: step over one character
      if (me >= s.size()) break;
      size_t next = me;
      utf8::next_code_point(s, next);
      out.append(s.substr(me, next - me));
      copied = pos = next;
    } else {
      pos = me;
    }
  }
  if (copied < s.size()) out.append(s.substr(copied));
  return out;
}

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& where) {
  Normalizer n;
  if (!j.is_null()) n.parse_into(j, where);
  return n;
}

void Normalizer::parse_into(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: normalizer must be null or an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  Step s;
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      fail("{}: Sequence normalizer needs a \"normalizers\" array", where);
    for (const auto& sub : j["normalizers"]) parse_into(sub, where);
    return;
  } else if (type == "NFC") {
    s.kind = Kind::NFC;
  } else if (type == "NFD") {
    s.kind = Kind::NFD;
  } else if (type == "NFKC") {
    s.kind = Kind::NFKC;
  } else if (type == "NFKD") {
    s.kind = Kind::NFKD;
  } else if (type == "Lowercase") {
    s.kind = Kind::Lowercase;
  } else if (type == "StripAccents") {
    s.kind = Kind::StripAccents;
  } else if (type == "Strip") {
    s.kind = Kind::Strip;
    s.left = j.value("strip_left", true);
    s.right = j.value("strip_right", true);
  } else if (type == "Prepend") {
    s.kind = Kind::Prepend;
    s.content = j.value("prepend", std::string());
  } else if (type == "Replace") {
    s.kind = Kind::Replace;
    const auto& pat = j.contains("pattern") ? j["pattern"] : nlohmann::json();
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      s.pattern = std::make_shared<Regex>(pat["Regex"].get<std::string>());
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      s.pattern = std::make_shared<Regex>(pat["String"].get<std::string>(), /*literal=*/true);
    } else {
      fail("{}: Replace normalizer needs pattern {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    }
    if (!j.contains("content") || !j["content"].is_string()) fail("{}: Replace normalizer needs a \"content\" string", where);
    s.content = j["content"].get<std::string>();
  } else {
    fail("{}: unsupported normalizer type \"{}\" (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
         "StripAccents, Strip, Replace, Prepend)",
         where, type);
  }
  steps_.push_back(std::move(s));
}

std::string Normalizer::apply(std::string_view text) const {
  std::string cur(text);
  for (const auto& s : steps_) {
    switch (s.kind) {
      case Kind::NFC: case Kind::NFD: case Kind::NFKC: case Kind::NFKD:
        cur = unicode_normalize(cur, s.kind);
        break;
      case Kind::Lowercase: cur = lowercase(cur); break;
      case Kind::StripAccents: cur = strip_accents(cur); break;
      case Kind::Strip: cur = strip_white_space(cur, s.left, s.right); break;
      case Kind::Replace: cur = replace_all(cur, *s.pattern, s.content); break;
      case Kind::Prepend:
        if (!cur.empty()) cur = s.content + cur;
        break;
    }
  }
  return cur;
}

}  // namespace dsv41::text
