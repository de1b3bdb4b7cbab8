#include <cstring>
#include <deque>

#include "dsv41/common/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dsv41::text {

namespace {

// Per-call memo of pre-token -> ids. Prose repeats a small set of words, so most pre-tokens are
// looked up instead of merged; keys point into the caller's text (or the piece arena). Open
// addressing over one flat array: the lookup is memory-latency bound, so it avoids node chasing.
class WordCache {
 public:
  struct Entry {
    uint32_t first, count;
  };
  static constexpr size_t kMaxWordBytes = 96;

  explicit WordCache(size_t text_bytes) {
    size_t cap = 64;
    while (cap < text_bytes / 16 && cap < (size_t{1} << 20)) cap <<= 1;
    slots_.assign(cap, Slot{});
  }

  static uint64_t hash(std::string_view w) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ w.size();
    size_t i = 0;
    for (; i + 8 <= w.size(); i += 8) {
      uint64_t x;
      std::memcpy(&x, w.data() + i, 8);
      h = (h ^ x) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, w.data() + i, w.size() - i);
    h = (h ^ tail) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
  }

  const Entry* find(std::string_view w, uint64_t h) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (!s.key) return nullptr;
      if (s.hash == h && s.len == w.size() && std::memcmp(s.key, w.data(), w.size()) == 0) return &s.entry;
    }
  }

  void put(std::string_view w, uint64_t h, const int32_t* ids, const uint32_t* ends, uint32_t n) {
    if ((used_ + 1) * 2 > slots_.size()) grow();
    Entry e{static_cast<uint32_t>(ids_.size()), n};
    ids_.insert(ids_.end(), ids, ids + n);
    ends_.insert(ends_.end(), ends, ends + n);
    insert(Slot{h, w.data(), static_cast<uint32_t>(w.size()), e});
    ++used_;
  }
  const int32_t* ids(const Entry& e) const { return ids_.data() + e.first; }
  const uint32_t* ends(const Entry& e) const { return ends_.data() + e.first; }

 private:
  struct Slot {
    uint64_t hash = 0;
    const char* key = nullptr;
    uint32_t len = 0;
    Entry entry{0, 0};
  };
  void insert(const Slot& s) {
    const size_t mask = slots_.size() - 1;
    size_t i = s.hash & mask;
    while (slots_[i].key) i = (i + 1) & mask;
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.key) insert(s);
  }
  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::vector<int32_t> ids_;
  std::vector<uint32_t> ends_;
};

}  // namespace

void Tokenizer::Impl::encode(std::string_view text, bool match_added, std::vector<TokenId>& ids,
                             std::vector<std::pair<size_t, size_t>>* offsets) const {
  if (!utf8::is_valid(text)) fail("cannot tokenize: the text is not valid UTF-8");
  if (text.size() > UINT32_MAX) fail("cannot tokenize: text of {} bytes is too long", text.size());

  std::vector<AddedTokenMatcher::Segment> pass1, pass2;
  if (match_added && !raw_matcher.empty()) raw_matcher.split(text, 0, text.size(), pass1);
  else pass1.push_back({0, text.size(), -1});

  WordCache cache(text.size());
  std::vector<Piece> pieces, scratch;
  std::deque<std::string> arena;  // normalized text and synthetic-prefix pieces
  std::vector<int32_t> word_ids;
  std::vector<uint32_t> word_ends;

  auto emit_token = [&](TokenId id, size_t b, size_t e) {
    ids.push_back(id);
    if (offsets) offsets->emplace_back(b, e);
  };

  // Pre-tokenizes and merges one stretch of text. base_offset maps bytes of `s` to the input;
  // when `coarse`, s is normalized text and every token gets the whole stretch as its offsets.
  auto encode_plain = [&](std::string_view s, size_t base_offset, bool coarse, size_t coarse_end) {
    pieces.clear();
    pieces.push_back(Piece{s.data(), static_cast<uint32_t>(s.size()), 0, 0});
    pre_tokenizer.run(pieces, scratch, arena);
    for (const Piece& p : pieces) {
      const std::string_view w = p.view();
      const auto* bytes = reinterpret_cast<const uint8_t*>(w.data());
      const int32_t* wid;
      const uint32_t* wend;
      uint32_t n;
      const bool cacheable = w.size() <= WordCache::kMaxWordBytes;
      const uint64_t h = cacheable ? WordCache::hash(w) : 0;
      const WordCache::Entry* hit = cacheable ? cache.find(w, h) : nullptr;
      if (hit) {
        wid = cache.ids(*hit);
        wend = cache.ends(*hit);
        n = hit->count;
      } else {
        word_ids.clear();
        word_ends.clear();
        bpe.encode_word(bytes, w.size(), word_ids, &word_ends);
        n = static_cast<uint32_t>(word_ids.size());
        if (cacheable) cache.put(w, h, word_ids.data(), word_ends.data(), n);
        wid = word_ids.data();
        wend = word_ends.data();
      }
      uint32_t begin = 0;
      for (uint32_t k = 0; k < n; ++k) {
        if (coarse) {
          emit_token(wid[k], base_offset, coarse_end);
        } else {
          // piece bytes [begin, end) -> input bytes, a synthetic prefix maps to zero width
          const auto map = [&](uint32_t x) {
            return base_offset + p.orig + (x > p.synthetic ? x - p.synthetic : 0);
          };
          emit_token(wid[k], map(begin), map(wend[k]));
        }
        begin = wend[k];
      }
    }
  };

  for (const auto& seg : pass1) {
    if (seg.token >= 0) {
      emit_token(seg.token, seg.begin, seg.end);
      continue;
    }
    const std::string_view raw = text.substr(seg.begin, seg.end - seg.begin);
    std::string_view work = raw;
    const bool normalized = !normalizer.empty();
    if (normalized) {
      arena.push_back(normalizer.apply(raw));
      work = arena.back();
    }
    pass2.clear();
    if (match_added && !normalized_matcher.empty()) normalized_matcher.split(work, 0, work.size(), pass2);
    else pass2.push_back({0, work.size(), -1});
    for (const auto& s2 : pass2) {
      if (s2.token >= 0) {
        if (normalized) emit_token(s2.token, seg.begin, seg.end);
        else emit_token(s2.token, seg.begin + s2.begin, seg.begin + s2.end);
        continue;
      }
      const std::string_view part = work.substr(s2.begin, s2.end - s2.begin);
      if (normalized) encode_plain(part, seg.begin, true, seg.end);
      else encode_plain(part, seg.begin + s2.begin, false, 0);
    }
  }
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool match_added_tokens) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, match_added_tokens, ids, nullptr);
  return ids;
}

Encoding Tokenizer::encode_with_offsets(std::string_view text, bool match_added_tokens) const {
  Encoding e;
  impl_->encode(text, match_added_tokens, e.ids, &e.offsets);
  return e;
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->token_bytes.size())
    fail("token id {} is out of range (vocabulary size {})", id, impl_->token_bytes.size());
  return impl_->token_bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->token_strings.size())
    fail("token id {} is out of range (vocabulary size {})", id, impl_->token_strings.size());
  return impl_->token_strings[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string bytes;
  for (TokenId id : ids) bytes += token_bytes(id);
  return utf8::decode_lossy(bytes);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->bpe.vocab().find(key); it != impl_->bpe.vocab().end()) return it->second;
  return std::nullopt;
}

TokenId Tokenizer::require_token(std::string_view token) const {
  auto id = token_to_id(token);
  if (!id) fail("tokenizer {} has no token \"{}\"", impl_->origin, token);
  return *id;
}

size_t Tokenizer::vocab_size() const { return impl_->token_strings.size(); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() &&
         (impl_->flags[static_cast<size_t>(id)] & Impl::kSpecial);
}

bool Tokenizer::is_added(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() &&
         (impl_->flags[static_cast<size_t>(id)] & Impl::kAdded);
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer) : tok_(tokenizer) {}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tok_.token_bytes(id);
  const size_t n = utf8::complete_prefix(pending_);
  if (n == 0) return {};
  std::string out = utf8::decode_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::decode_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv41::text
