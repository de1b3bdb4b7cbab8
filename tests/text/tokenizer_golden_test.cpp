// Tokenizer against tokenizer_golden.json (HF tokenizers 0.23.2 with DeepSeek-V3's file).
#include <gtest/gtest.h>

#include "dsv41/common/error.h"
#include "text/utf8.h"
#include "text_test_util.h"

namespace dsv41::text {
namespace {

using testing::read_json;
using testing::v3_tokenizer;

const nlohmann::ordered_json& golden() {
  static const auto g = read_json("tokenizer/tokenizer_golden.json");
  return g;
}

// Byte offsets -> code point offsets, as HF reports them (a token holding part of a character
// covers that whole character).
std::pair<size_t, size_t> char_offsets(const std::string& text, std::pair<size_t, size_t> b) {
  auto char_index = [&](size_t byte) { return utf8::count_code_points(std::string_view(text).substr(0, byte + 1)) - 1; };
  if (b.first == b.second) {
    const size_t c = utf8::count_code_points(std::string_view(text).substr(0, b.first));
    return {c, c};
  }
  return {char_index(b.first), char_index(b.second - 1) + 1};
}

TEST(TokenizerGolden, VocabularySize) {
  EXPECT_EQ(v3_tokenizer().vocab_size(), golden()["tokenizer_vocab_size_with_added"].get<size_t>());
}

TEST(TokenizerGolden, EveryCaseIds) {
  const auto& cases = golden()["cases"];
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const auto ids = v3_tokenizer().encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
  }
}

TEST(TokenizerGolden, EveryCaseOffsets) {
  for (const auto& c : golden()["cases"]) {
    const std::string text = c["text"];
    const auto enc = v3_tokenizer().encode_with_offsets(text);
    const auto& want = c["offsets"];
    ASSERT_EQ(enc.offsets.size(), want.size()) << text;
    for (size_t i = 0; i < want.size(); ++i) {
      const auto got = char_offsets(text, enc.offsets[i]);
      EXPECT_EQ(got.first, want[i][0].get<size_t>()) << text << " token " << i;
      EXPECT_EQ(got.second, want[i][1].get<size_t>()) << text << " token " << i;
    }
  }
}

TEST(TokenizerGolden, EveryCaseDecodes) {
  for (const auto& c : golden()["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(v3_tokenizer().decode(ids), c["decoded"].get<std::string>());
  }
}

TEST(TokenizerGolden, StreamingDecodeEqualsDecodeAndIsAlwaysValidUtf8) {
  size_t held_back = 0;
  for (const auto& c : golden()["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    StreamDecoder sd(v3_tokenizer());
    std::string all;
    for (int32_t id : ids) {
      const std::string piece = sd.push(id);
      EXPECT_TRUE(utf8::is_valid(piece));
      if (sd.pending_bytes() > 0) ++held_back;
      all += piece;
    }
    all += sd.finish();
    EXPECT_EQ(all, c["decoded"].get<std::string>());
  }
  EXPECT_GT(held_back, 0u) << "the golden set has tokens that split a character; some bytes must be held";
}

}  // namespace
}  // namespace dsv41::text
