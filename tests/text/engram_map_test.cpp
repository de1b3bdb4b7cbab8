// Engram token map against engram_token_map_v3.json (the reference normaliser chain on the
// DeepSeek-V3 tokenizer).
#include <gtest/gtest.h>

#include "dsv41/text/engram_map.h"
#include "text_test_util.h"

namespace dsv41::text {
namespace {

TEST(EngramMap, EqualsFixtureForV3Tokenizer) {
  const auto want = testing::read_json("tokenizer/engram_token_map_v3.json");
  const auto got = compute_engram_token_map(testing::v3_tokenizer());
  EXPECT_EQ(got.compressed_vocab_size, want["compressed_vocab_size"].get<int32_t>());
  EXPECT_EQ(got.compressed_vocab_size, 98627);
  const auto want_map = want["token_map"].get<std::vector<int32_t>>();
  ASSERT_EQ(got.token_map.size(), want_map.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < want_map.size(); ++i) {
    if (got.token_map[i] != want_map[i] && ++mismatches <= 10)
      ADD_FAILURE() << "id " << i << " token \"" << testing::v3_tokenizer().id_to_token(static_cast<TokenId>(i))
                    << "\": got " << got.token_map[i] << " want " << want_map[i];
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(EngramMap, NormalizerChain) {
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("Café"), "cafe");
  EXPECT_EQ(engram_normalize("ＡＢＣ"), "abc");         // NFKC folds fullwidth forms
  EXPECT_EQ(engram_normalize("\t\n "), " ");            // a whitespace-only token stays one space
  EXPECT_EQ(engram_normalize("  a \n\n b  "), "a b");
  EXPECT_EQ(engram_normalize("\xE2\x80\xA8"), "");      // U+2028 is stripped (caller falls back)
}

}  // namespace
}  // namespace dsv41::text
