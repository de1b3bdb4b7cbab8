// tokenizer.json -> Tokenizer::Impl. Every unsupported component is rejected by name.
#include <fstream>
#include <sstream>

#include "dsv41/common/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dsv41::text {

namespace {

// The decoder must turn byte-level characters back into bytes: ByteLevel, alone or in a Sequence
// (null behaves the same for a byte-level model).
void check_decoder(const nlohmann::json& d, const std::string& where) {
  if (d.is_null()) return;
  if (!d.is_object() || !d.contains("type") || !d["type"].is_string())
    fail("{}: decoder must be null or an object with a \"type\"", where);
  const std::string type = d["type"].get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    for (const auto& sub : d["decoders"]) check_decoder(sub, where);
    return;
  }
  fail("{}: unsupported decoder type \"{}\" (a byte-level BPE tokenizer uses ByteLevel)", where, type);
}

bool flag(const nlohmann::json& o, const char* key) { return o.contains(key) && o[key].is_boolean() && o[key].get<bool>(); }

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open tokenizer file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json_text(ss.str(), path);
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object()) fail("{}: tokenizer.json must be a JSON object", origin);
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  auto field = [&](const char* k) -> const nlohmann::json& {
    static const nlohmann::json null_json;
    return j.contains(k) ? j[k] : null_json;
  };

  if (!j.contains("model")) fail("{}: missing \"model\"", origin);
  impl->bpe.load(j["model"], origin);
  impl->normalizer = Normalizer::from_json(field("normalizer"), origin);
  bool byte_level = false;
  impl->pre_tokenizer = PreTokenizer::from_json(field("pre_tokenizer"), origin, &byte_level);
  if (!byte_level) fail("{}: pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are supported", origin);
  check_decoder(field("decoder"), origin);

  const auto& at = field("added_tokens");
  if (!at.is_null() && !at.is_array()) fail("{}: added_tokens must be an array", origin);
  size_t max_id = impl->bpe.id_to_token().size();
  if (at.is_array()) {
    for (const auto& o : at) {
      if (!o.is_object() || !o.contains("id") || !o["id"].is_number_integer() || !o.contains("content") ||
          !o["content"].is_string())
        fail("{}: every added token needs an integer \"id\" and a string \"content\"", origin);
      AddedToken t;
      const int64_t id = o["id"].get<int64_t>();
      if (id < 0 || id > INT32_MAX) fail("{}: added token id {} is out of range", origin, id);
      t.id = static_cast<TokenId>(id);
      t.content = o["content"].get<std::string>();
      t.special = flag(o, "special");
      t.lstrip = flag(o, "lstrip");
      t.rstrip = flag(o, "rstrip");
      t.normalized = o.contains("normalized") ? flag(o, "normalized") : !t.special;
      t.single_word = flag(o, "single_word");
      max_id = std::max(max_id, static_cast<size_t>(t.id) + 1);
      impl->added.push_back(std::move(t));
    }
  }

  // id tables: vocabulary entries first, added tokens take precedence (as in HF id_to_token).
  impl->token_strings = impl->bpe.id_to_token();
  impl->token_strings.resize(max_id);
  impl->flags.assign(max_id, 0);
  std::vector<AddedToken> raw, normalized;
  for (const auto& t : impl->added) {
    impl->token_strings[static_cast<size_t>(t.id)] = t.content;
    impl->flags[static_cast<size_t>(t.id)] = Impl::kAdded | (t.special ? Impl::kSpecial : 0);
    impl->added_by_content.emplace(t.content, t.id);
    (t.normalized ? normalized : raw).push_back(t);  // two passes, as HF does
  }
  impl->raw_matcher.build(raw);
  impl->normalized_matcher.build(normalized);

  // Decoded bytes per id: the ByteLevel decoder maps each character back to its byte; a token
  // with a character outside the alphabet (e.g. "<｜User｜>") decodes to its own UTF-8 bytes.
  const auto& alphabet = byte_level_alphabet();
  impl->token_bytes.resize(max_id);
  for (size_t id = 0; id < max_id; ++id) {
    const std::string& s = impl->token_strings[id];
    if (!alphabet.to_bytes(s, impl->token_bytes[id])) impl->token_bytes[id] = s;
  }
  return Tokenizer(std::move(impl));
}

}  // namespace dsv41::text
