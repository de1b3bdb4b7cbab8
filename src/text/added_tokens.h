// Splits raw text on added tokens the way HF `tokenizers` does: leftmost-longest matches,
// single_word (no word character on either side), lstrip/rstrip (swallow neighbouring
// whitespace into the token).
#pragma once
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsv41/text/tokenizer.h"

namespace dsv41::text {

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin = 0, end = 0;
    int32_t token = -1;  // added token id, or -1 for plain text
  };

  void build(const std::vector<AddedToken>& tokens);  // tokens to match (already filtered)
  bool empty() const { return tokens_.empty(); }
  // Appends the segments of text[begin, end) (text/token alternating as found).
  void split(std::string_view text, size_t begin, size_t end, std::vector<Segment>& out) const;

 private:
  // Longest token starting at pos, or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t end, size_t* match_end) const;
  std::vector<AddedToken> tokens_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> terminal_;                 // node -> index into tokens_, or -1
  bool first_byte_[256] = {};
};

}  // namespace dsv41::text
