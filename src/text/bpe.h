// Byte-level BPE model: vocabulary, merges by rank, and the merge loop. Words are given as raw
// bytes; each byte starts as the token of its byte-level character (GPT-2 alphabet).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv41::text {

// The GPT-2 byte <-> character table: bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to the same code
// point; the other 68 bytes, ascending, to U+0100, U+0101, ...
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;  // byte_to_cp as UTF-8
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelAlphabet();
  // Maps a token string back to bytes; false when a character is outside the alphabet.
  bool to_bytes(const std::string& token, std::string& bytes) const;
};
const ByteLevelAlphabet& byte_level_alphabet();

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object (type BPE). Throws naming `where`.
  void load(const nlohmann::json& model, const std::string& where);

  // Which merge loop runs: a rescan of a small array for short words, a heap over a linked
  // list for long ones (Auto). Both give the same result; tests force each one.
  enum class MergeLoop { Auto, Scan, Heap };

  // Appends the ids of one pre-token. If ends != nullptr, appends each token's end byte offset
  // (relative to the word start).
  void encode_word(const uint8_t* bytes, size_t n, std::vector<int32_t>& ids, std::vector<uint32_t>* ends,
                   MergeLoop loop = MergeLoop::Auto) const;

  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  size_t merge_count() const { return merge_count_; }

 private:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  void insert_merge(int32_t a, int32_t b, int32_t rank, int32_t merged);
  const Slot* find_merge(int32_t a, int32_t b) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
    for (;;) {
      const Slot& s = table_[h];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
      h = (h + 1) & mask_;
    }
  }
  void merge_small(std::vector<int32_t>& ids, std::vector<uint32_t>& ends) const;
  void merge_large(std::vector<int32_t>& ids, std::vector<uint32_t>& ends) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::array<int32_t, 256> byte_token_{};
  std::vector<Slot> table_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t merge_count_ = 0;
  bool ignore_merges_ = false;
};

}  // namespace dsv41::text
