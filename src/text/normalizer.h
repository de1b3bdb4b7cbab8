// Text normalizers of HF `tokenizers` that a byte-level BPE file or the Engram token map can
// use: NFC/NFD/NFKC/NFKD, Lowercase, StripAccents, Strip, Replace, Prepend and Sequence.
// Unicode data comes from utf8proc. Anything else is rejected with a clear error.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/regex.h"

namespace dsv41::text {

class Normalizer {
 public:
  enum class Kind { NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, Replace, Prepend };
  struct Step {
    Kind kind = Kind::NFC;
    bool left = true, right = true;   // Strip
    std::shared_ptr<Regex> pattern;   // Replace
    std::string content;              // Replace / Prepend
  };

  // `null`, a single normalizer object or a (nested) Sequence. `where` names the file/field.
  static Normalizer from_json(const nlohmann::json& j, const std::string& where);

  void add(Step s) { steps_.push_back(std::move(s)); }
  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;  // text must be valid UTF-8

 private:
  void parse_into(const nlohmann::json& j, const std::string& where);
  std::vector<Step> steps_;
};

// Single steps, usable on their own (input valid UTF-8).
std::string unicode_normalize(std::string_view s, Normalizer::Kind form);  // NFC/NFD/NFKC/NFKD
std::string lowercase(std::string_view s);       // per-character full lowercase (Rust char::to_lowercase)
std::string strip_accents(std::string_view s);   // drops combining marks (General_Category M)
std::string strip_white_space(std::string_view s, bool left, bool right);
std::string replace_all(std::string_view s, const Regex& pattern, std::string_view content);

}  // namespace dsv41::text
