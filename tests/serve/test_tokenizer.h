// A byte-level test vocabulary that fits the tiny models' 512 ids: 0/1/2 = BOS/EOS/pad, 3..258 =
// the 256 bytes (GPT-2 byte alphabet), then the chat markers as added tokens, then a few merges.
// Written as a Hugging Face tokenizer.json so the real Tokenizer loads it.
#pragma once
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace dsv41::test_support {

inline std::string byte_char(int b) {
  // GPT-2 byte-to-unicode map (CHAT.md §1.5).
  auto printable = [](int x) { return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The markers the chat encoder and output parser use, at fixed ids.
inline const std::vector<std::pair<int, std::string>>& test_added_tokens() {
  static const std::vector<std::pair<int, std::string>> t = {
      {0, "<｜begin▁of▁sentence｜>"}, {1, "<｜end▁of▁sentence｜>"}, {2, "<｜▁pad▁｜>"},
      {300, "<｜System｜>"}, {301, "<｜User｜>"}, {302, "<｜Assistant｜>"},
      {303, "<think>"}, {304, "</think>"}, {305, "｜DSML｜"}};
  return t;
}
constexpr int kTestAssistant = 302;

inline std::string test_tokenizer_json() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (auto& [id, s] : test_added_tokens())
    if (id < 3) vocab[s] = id;
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = 3 + b;
  // A few merges so that some tokens span several bytes (stop strings across token boundaries).
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  const std::vector<std::pair<std::string, std::string>> m = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"o", "Ġ"}, {"Ġ", "w"}};
  int next = 310;
  for (auto& [a, b] : m) {
    merges.push_back(a + " " + b);
    vocab[a + b] = next++;
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (auto& [id, s] : test_added_tokens()) {
    added.push_back({{"id", id}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
    if (id >= 3) vocab[s] = id;
  }
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                {"merges", merges}};
  return j.dump();
}

inline void write_test_tokenizer(const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  f << test_tokenizer_json();
}

}  // namespace dsv41::test_support
