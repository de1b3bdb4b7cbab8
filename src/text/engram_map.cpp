#include "dsv41/text/engram_map.h"

#include <unordered_map>

#include "dsv41/loader/safetensors.h"
#include "text/normalizer.h"
#include "text/regex.h"
#include "text/utf8.h"

namespace dsv41::text {

namespace {

constexpr std::string_view kSentinel = "\xEE\x80\x80";  // U+E000, private use

}  // namespace

std::string engram_normalize(std::string_view decoded) {
  static const Regex whitespace_run("[ \\t\\r\\n]+");
  static const Regex sentinel(kSentinel, /*literal=*/true);
  std::string s = unicode_normalize(decoded, Normalizer::Kind::NFKC);
  s = unicode_normalize(s, Normalizer::Kind::NFD);
  s = strip_accents(s);
  s = lowercase(s);
  s = replace_all(s, whitespace_run, " ");
  // A string that is exactly one space would vanish in the strip: park it on a sentinel.
  if (s == " ") s = std::string(kSentinel);
  s = strip_white_space(s, true, true);
  // Every sentinel becomes a space again (also one that was in the token itself).
  return replace_all(s, sentinel, " ");
}

EngramTokenMap compute_engram_token_map(const Tokenizer& tok) {
  EngramTokenMap m;
  const size_t n = tok.vocab_size();
  m.token_map.resize(n);
  std::unordered_map<std::string, int32_t> key_to_id;
  key_to_id.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const auto tid = static_cast<TokenId>(id);
    const std::string text = utf8::decode_lossy(tok.token_bytes(tid));
    std::string key;
    if (text.find(utf8::kReplacement) != std::string::npos) {
      key = tok.id_to_token(tid);
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] = key_to_id.emplace(std::move(key), static_cast<int32_t>(key_to_id.size()));
    m.token_map[id] = it->second;
  }
  m.compressed_vocab_size = static_cast<int32_t>(key_to_id.size());
  return m;
}

std::string engram_map_to_json(const EngramTokenMap& m) {
  std::string out = "{\"compressed_vocab_size\": " + std::to_string(m.compressed_vocab_size) + ", \"token_map\": [";
  for (size_t i = 0; i < m.token_map.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(m.token_map[i]);
  }
  out += "]}\n";
  return out;
}

void write_engram_map_safetensors(const EngramTokenMap& m, const std::string& path) {
  SafetensorsWriter w;
  w.add("token_map", DType::I32, {static_cast<int64_t>(m.token_map.size())}, m.token_map);
  w.set_metadata("compressed_vocab_size", std::to_string(m.compressed_vocab_size));
  w.write(path);
}

}  // namespace dsv41::text
