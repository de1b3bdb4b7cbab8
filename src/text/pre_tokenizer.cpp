#include "text/pre_tokenizer.h"

#include <algorithm>

#include "dsv41/common/error.h"
#include "text/utf8.h"

namespace dsv41::text {

namespace {

// The GPT-2 split regex that ByteLevel applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Range {
  uint32_t b, e;
  bool is_match;
};

Piece sub_piece(const Piece& p, uint32_t b, uint32_t e) {
  Piece s;
  s.ptr = p.ptr + b;
  s.len = e - b;
  if (b == 0 && p.synthetic) {
    s.orig = p.orig;
    s.synthetic = static_cast<uint8_t>(std::min<uint32_t>(p.synthetic, s.len));
  } else {
    s.orig = p.orig + b - p.synthetic;
    s.synthetic = 0;
  }
  return s;
}

// All matches and gaps of `re` in the piece, as HF's Pattern::find_matches lists them
// (empty matches included; the search then moves on by one character).
void find_ranges(const Regex& re, std::string_view text, std::vector<Range>& ranges) {
  ranges.clear();
  size_t pos = 0, prev = 0, mb = 0, me = 0;
  while (pos <= text.size() && re.find(text, pos, mb, me)) {
    if (prev != mb) ranges.push_back({static_cast<uint32_t>(prev), static_cast<uint32_t>(mb), false});
    ranges.push_back({static_cast<uint32_t>(mb), static_cast<uint32_t>(me), true});
    prev = me;
    if (me == mb) {
      if (me >= text.size()) break;
      size_t next = me;
      utf8::next_code_point(text, next);
      pos = next;
    } else {
      pos = me;
    }
  }
  if (prev != text.size()) ranges.push_back({static_cast<uint32_t>(prev), static_cast<uint32_t>(text.size()), false});
}

// Applies a split behavior to the listed ranges (HF SplitDelimiterBehavior); returns the kept
// ranges in order (possibly empty ones, which the caller drops).
void apply_behavior(std::vector<Range>& r, SplitBehavior behavior, std::vector<Range>& out) {
  out.clear();
  switch (behavior) {
    case SplitBehavior::Isolated:
      out = r;
      return;
    case SplitBehavior::Removed:
      for (const auto& x : r)
        if (!x.is_match) out.push_back(x);
      return;
    case SplitBehavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const auto& x : r) {
        if (x.is_match && !previous_match && !out.empty()) out.back().e = x.e;
        else out.push_back({x.b, x.e, false});
        previous_match = x.is_match;
      }
      return;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;
      for (size_t k = r.size(); k-- > 0;) {
        const auto& x = r[k];
        if (x.is_match && !previous_match && !out.empty()) out.back().b = x.b;
        else out.push_back({x.b, x.e, false});
        previous_match = x.is_match;
      }
      std::reverse(out.begin(), out.end());
      return;
    }
    case SplitBehavior::Contiguous: {
      bool previous_match = false;
      for (const auto& x : r) {
        if (x.is_match == previous_match && !out.empty()) out.back().e = x.e;
        else out.push_back({x.b, x.e, false});
        previous_match = x.is_match;
      }
      return;
    }
  }
}

SplitBehavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unknown Split behavior \"{}\"", where, s);
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& where, bool* byte_level) {
  PreTokenizer p;
  *byte_level = false;
  if (!j.is_null()) p.parse_into(j, where, byte_level);
  return p;
}

void PreTokenizer::parse_into(const nlohmann::json& j, const std::string& where, bool* byte_level) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: pre_tokenizer must be null or an object with a \"type\"", where);
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      fail("{}: Sequence pre_tokenizer needs a \"pretokenizers\" array", where);
    for (const auto& sub : j["pretokenizers"]) parse_into(sub, where, byte_level);
    return;
  }
  Step s;
  if (type == "Split") {
    const auto& pat = j.contains("pattern") ? j["pattern"] : nlohmann::json();
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
      s.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>());
    else if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
      s.regex = std::make_shared<Regex>(pat["String"].get<std::string>(), /*literal=*/true);
    else
      fail("{}: Split pre_tokenizer needs pattern {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    s.behavior = parse_behavior(j.value("behavior", std::string("Isolated")), where);
    s.invert = j.value("invert", false);
  } else if (type == "Digits") {
    s.regex = std::make_shared<Regex>("\\p{N}");
    s.behavior = j.value("individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous;
  } else if (type == "ByteLevel") {
    *byte_level = true;
    s.kind = Step::Kind::ByteLevel;
    s.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern);
  } else {
    fail("{}: unsupported pre_tokenizer type \"{}\" (supported: Sequence, Split, Digits, ByteLevel)", where, type);
  }
  steps_.push_back(std::move(s));
}

void PreTokenizer::run(std::vector<Piece>& pieces, std::vector<Piece>& scratch,
                       std::deque<std::string>& arena) const {
  std::vector<Range> ranges, kept;
  for (const auto& st : steps_) {
    scratch.clear();
    for (const Piece& p : pieces) {
      Piece cur = p;
      if (st.kind == Step::Kind::ByteLevel && st.add_prefix_space && (cur.len == 0 || cur.ptr[0] != ' ')) {
        std::string prefixed;
        prefixed.reserve(cur.len + 1);
        prefixed.push_back(' ');
        prefixed.append(cur.view());
        arena.push_back(std::move(prefixed));
        cur.ptr = arena.back().data();
        cur.len += 1;
        cur.synthetic = 1;
      }
      if (!st.regex) {
        scratch.push_back(cur);
        continue;
      }
      const std::string_view text = cur.view();
      const SplitBehavior behavior = st.kind == Step::Kind::ByteLevel ? SplitBehavior::Isolated : st.behavior;
      if (behavior == SplitBehavior::Isolated && !st.invert) {
        // Fast path: every match and every gap becomes a piece.
        size_t pos = 0, prev = 0, mb = 0, me = 0;
        while (pos < text.size() && st.regex->find(text, pos, mb, me)) {
          if (prev != mb) scratch.push_back(sub_piece(cur, static_cast<uint32_t>(prev), static_cast<uint32_t>(mb)));
          if (me != mb) {
            scratch.push_back(sub_piece(cur, static_cast<uint32_t>(mb), static_cast<uint32_t>(me)));
            prev = pos = me;
          } else {
            prev = mb;
            size_t next = me;
            utf8::next_code_point(text, next);
            pos = next;
          }
        }
        if (prev != text.size())
          scratch.push_back(sub_piece(cur, static_cast<uint32_t>(prev), static_cast<uint32_t>(text.size())));
        continue;
      }
      find_ranges(*st.regex, text, ranges);
      if (st.invert)
        for (auto& r : ranges) r.is_match = !r.is_match;
      apply_behavior(ranges, behavior, kept);
      for (const auto& r : kept)
        if (r.e > r.b) scratch.push_back(sub_piece(cur, r.b, r.e));
    }
    pieces.swap(scratch);
  }
}

}  // namespace dsv41::text
