// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json` (the DeepSeek family and
// other GPT-2-style files): added tokens, normalizer, Split/ByteLevel/Digits pre-tokenizers with
// Unicode regexes (PCRE2, JIT), rank-ordered merges and the ByteLevel decoder.
// Encoding has `add_special_tokens=false` semantics: no BOS/EOS is added, the post-processor is
// not applied. A Tokenizer is immutable after loading and safe to share between threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv41::text {

using TokenId = int32_t;

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// Ids plus, for each id, the byte range [first, second) of the input it came from. Offsets
// refer to the input text when the normalizer is a no-op (the DeepSeek family); with a
// non-trivial normalizer they refer to the normalized text.
struct Encoding {
  std::vector<TokenId> ids;
  std::vector<std::pair<size_t, size_t>> offsets;
};

class Tokenizer {
 public:
  // Throws dsv41::Error naming the file and the unsupported or malformed field.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json_text(std::string_view json_text, const std::string& origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&);  // cheap: shares the immutable tables
  Tokenizer& operator=(const Tokenizer&);
  ~Tokenizer();

  // Text must be valid UTF-8 (dsv41::Error otherwise). With match_added_tokens=false the
  // added/special token strings are treated as ordinary text (safe encoding of user text).
  std::vector<TokenId> encode(std::string_view text, bool match_added_tokens = true) const;
  Encoding encode_with_offsets(std::string_view text, bool match_added_tokens = true) const;

  // Concatenated token bytes, made valid UTF-8 the way HF does (ill-formed parts -> U+FFFD).
  // Added tokens decode to their content; nothing is skipped. Throws on ids out of range.
  std::string decode(std::span<const TokenId> ids) const;
  // The raw bytes one token stands for (may be a partial UTF-8 sequence).
  const std::string& token_bytes(TokenId id) const;
  // The token's string as stored in tokenizer.json (byte-level alphabet, or added content).
  const std::string& id_to_token(TokenId id) const;

  // Id of an added token by content, else of a vocabulary entry by its stored string.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // Like token_to_id but throws "tokenizer has no token <text>" when absent.
  TokenId require_token(std::string_view token) const;

  // Highest id + 1 (vocabulary plus added tokens): HF's len(tokenizer).
  size_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;
  bool is_special(TokenId id) const;  // an added token with special=true
  bool is_added(TokenId id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenizer for streaming: push ids one by one, get text that is always valid
// UTF-8; bytes of a character split across tokens are held until it completes. The
// concatenation of all push() results and finish() equals Tokenizer::decode of all ids.
// Keeps its own (cheap, shared) copy of the tokenizer.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer);
  std::string push(TokenId id);
  std::string finish();  // flushes a dangling incomplete sequence as U+FFFD
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tok_;
  std::string pending_;
};

}  // namespace dsv41::text
