// Pre-tokenizers of HF `tokenizers` for byte-level BPE: Sequence, Split (all five behaviors,
// invert), Digits and ByteLevel (add_prefix_space, optional GPT-2 regex). Each step splits every
// piece produced by the previous one; regexes run on each piece as its own subject.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/regex.h"

namespace dsv41::text {

// A piece of text being pre-tokenized. Bytes [synthetic, len) of the piece correspond to input
// bytes [orig, orig + len - synthetic); a synthetic prefix is a space added by ByteLevel.
struct Piece {
  const char* ptr = nullptr;
  uint32_t len = 0;
  uint32_t orig = 0;
  uint8_t synthetic = 0;
  std::string_view view() const { return {ptr, len}; }
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  // `null` or a pre_tokenizer object. Sets *byte_level when a ByteLevel step is present.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where, bool* byte_level);

  // Splits `pieces` in place. `arena` keeps strings created for synthetic prefixes alive.
  void run(std::vector<Piece>& pieces, std::vector<Piece>& scratch, std::deque<std::string>& arena) const;

 private:
  struct Step {
    enum class Kind { Split, ByteLevel } kind = Kind::Split;
    std::shared_ptr<Regex> regex;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;
  };
  void parse_into(const nlohmann::json& j, const std::string& where, bool* byte_level);
  std::vector<Step> steps_;
};

}  // namespace dsv41::text
