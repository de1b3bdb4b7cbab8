// Engram compressed token map (MODEL.md §5.3): every id is decoded alone, normalized with
// NFKC -> NFD -> strip accents -> lowercase -> whitespace runs to one space -> strip (a string
// that is exactly one space is kept), and ids that normalize alike share a compressed id, numbered
// in order of first appearance. Partial UTF-8 tokens (decoded text holds U+FFFD) are keyed by their
// raw token string; an empty normalized text falls back to the decoded text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsv41/text/tokenizer.h"

namespace dsv41::text {

struct EngramTokenMap {
  int32_t compressed_vocab_size = 0;
  std::vector<int32_t> token_map;  // raw id -> compressed id, one entry per id of the tokenizer
};

// The normalizer chain applied to one decoded token (exposed for tests).
std::string engram_normalize(std::string_view decoded);

EngramTokenMap compute_engram_token_map(const Tokenizer& tok);

// {"compressed_vocab_size": N, "token_map": [...]}
std::string engram_map_to_json(const EngramTokenMap& m);
// safetensors with one int32 tensor `token_map` [vocab] (the engine's --engram-token-map format)
// and the size in the metadata key "compressed_vocab_size".
void write_engram_map_safetensors(const EngramTokenMap& m, const std::string& path);

}  // namespace dsv41::text
