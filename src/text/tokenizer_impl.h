// Internal state of dsv41::text::Tokenizer (shared, immutable after loading).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "dsv41/text/tokenizer.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"

namespace dsv41::text {

struct Tokenizer::Impl {
  std::string origin;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel bpe;
  std::vector<AddedToken> added;             // in file order
  AddedTokenMatcher raw_matcher;             // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher;      // added tokens with normalized=true
  std::unordered_map<std::string, TokenId> added_by_content;
  std::vector<std::string> token_strings;    // id -> string as stored in the file
  std::vector<std::string> token_bytes;      // id -> decoded bytes
  std::vector<uint8_t> flags;                // id -> kAdded | kSpecial
  static constexpr uint8_t kAdded = 1, kSpecial = 2;

  void encode(std::string_view text, bool match_added, std::vector<TokenId>& ids,
              std::vector<std::pair<size_t, size_t>>* offsets) const;
};

}  // namespace dsv41::text
