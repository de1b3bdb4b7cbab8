#include "text/bpe.h"

#include <climits>
#include <cstring>
#include <queue>

#include "dsv41/common/error.h"
#include "text/utf8.h"

namespace dsv41::text {

ByteLevelAlphabet::ByteLevelAlphabet() {
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool same = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_to_cp[b] = same ? static_cast<uint32_t>(b) : next++;
    utf8::append(byte_to_utf8[b], byte_to_cp[b]);
    cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
  }
}

bool ByteLevelAlphabet::to_bytes(const std::string& token, std::string& bytes) const {
  bytes.clear();
  if (!utf8::is_valid(token)) return false;
  size_t i = 0;
  while (i < token.size()) {
    auto it = cp_to_byte.find(utf8::next_code_point(token, i));
    if (it == cp_to_byte.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  return true;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

void BpeModel::insert_merge(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  for (;;) {
    Slot& s = table_[h];
    if (s.key == kEmpty || s.key == key) {  // a repeated pair keeps the later rank, as HF does
      s.key = key;
      s.rank = rank;
      s.merged = merged;
      return;
    }
    h = (h + 1) & mask_;
  }
}

void BpeModel::load(const nlohmann::json& m, const std::string& where) {
  if (!m.is_object()) fail("{}: \"model\" must be an object", where);
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") fail("{}: model type \"{}\" is not supported (only byte-level BPE)", where, type);
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0.0)
    fail("{}: BPE dropout is not supported for inference", where);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
      fail("{}: BPE {} is not supported in a byte-level tokenizer", where, k);
  ignore_merges_ = m.value("ignore_merges", false);

  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("{}: model.vocab must be an object", where);
  int32_t max_id = -1;
  vocab_.reserve(m["vocab"].size());
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() > INT32_MAX)
      fail("{}: model.vocab[\"{}\"] is not a valid id", where, tok);
    const auto id = static_cast<int32_t>(idj.get<int64_t>());
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;

  const auto& alphabet = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(alphabet.byte_to_utf8[b]);
    if (it == vocab_.end())
      fail("{}: not a byte-level vocabulary: byte 0x{:02X} (\"{}\") has no token", where, b, alphabet.byte_to_utf8[b]);
    byte_token_[b] = it->second;
  }

  if (!m.contains("merges") || !m["merges"].is_array()) fail("{}: model.merges must be an array", where);
  const auto& merges = m["merges"];
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  table_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  merge_count_ = merges.size();
  std::string a, b;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& e = merges[r];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("{}: merge #{} \"{}\" is not two tokens separated by one space", where, r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail("{}: merge #{} must be \"a b\" or [\"a\", \"b\"]", where, r);
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end())
      fail("{}: merge #{} uses a token missing from the vocabulary (\"{}\" \"{}\")", where, r, a, b);
    if (im == vocab_.end()) fail("{}: merge #{} result \"{}\" is missing from the vocabulary", where, r, a + b);
    insert_merge(ia->second, ib->second, static_cast<int32_t>(r), im->second);
  }
}

void BpeModel::merge_small(std::vector<int32_t>& ids, std::vector<uint32_t>& ends) const {
  size_t m = ids.size();
  int32_t rank[64], merged[64];
  auto pair_at = [&](size_t i) {
    const Slot* s = find_merge(ids[i], ids[i + 1]);
    rank[i] = s ? s->rank : INT32_MAX;
    merged[i] = s ? s->merged : 0;
  };
  for (size_t i = 0; i + 1 < m; ++i) pair_at(i);
  while (m > 1) {
    size_t bi = 0;
    int32_t best = rank[0];
    for (size_t i = 1; i + 1 < m; ++i)
      if (rank[i] < best) {
        best = rank[i];
        bi = i;
      }
    if (best == INT32_MAX) break;
    ids[bi] = merged[bi];
    ends[bi] = ends[bi + 1];
    const size_t tail = m - bi - 2;  // elements after bi+1
    std::memmove(&ids[bi + 1], &ids[bi + 2], tail * sizeof(int32_t));
    std::memmove(&ends[bi + 1], &ends[bi + 2], tail * sizeof(uint32_t));
    if (tail > 0) {
      // pair j (>= bi+1) of the shortened list is old pair j+1
      std::memmove(&rank[bi + 1], &rank[bi + 2], (tail - 1) * sizeof(int32_t));
      std::memmove(&merged[bi + 1], &merged[bi + 2], (tail - 1) * sizeof(int32_t));
    }
    --m;
    if (bi + 1 < m) pair_at(bi);
    if (bi > 0) pair_at(bi - 1);
  }
  ids.resize(m);
  ends.resize(m);
}

void BpeModel::merge_large(std::vector<int32_t>& ids, std::vector<uint32_t>& ends) const {
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Slot* s = find_merge(ids[pos], ids[next[pos]])) heap.push({s->rank, pos});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int32_t right = next[c.pos];
    const Slot* s = find_merge(ids[c.pos], ids[right]);
    if (!s || s->rank != c.rank) continue;  // stale: this pair changed since it was queued
    ids[c.pos] = s->merged;
    ends[c.pos] = ends[right];
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) {
    ids[w] = ids[i];
    ends[w] = ends[i];
    ++w;
  }
  ids.resize(w);
  ends.resize(w);
}

void BpeModel::encode_word(const uint8_t* bytes, size_t n, std::vector<int32_t>& out,
                           std::vector<uint32_t>* out_ends, MergeLoop loop) const {
  if (n == 0) return;
  if (ignore_merges_) {
    std::string mapped;
    const auto& alphabet = byte_level_alphabet();
    for (size_t i = 0; i < n; ++i) mapped += alphabet.byte_to_utf8[bytes[i]];
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      if (out_ends) out_ends->push_back(static_cast<uint32_t>(n));
      return;
    }
  }
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<uint32_t> ends;
  ids.resize(n);
  ends.resize(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = byte_token_[bytes[i]];
    ends[i] = static_cast<uint32_t>(i + 1);
  }
  const bool scan = loop == MergeLoop::Scan || (loop == MergeLoop::Auto && n <= 64);
  if (scan && n <= 64) merge_small(ids, ends);  // the scan keeps its pair ranks on the stack
  else merge_large(ids, ends);
  out.insert(out.end(), ids.begin(), ids.end());
  if (out_ends) out_ends->insert(out_ends->end(), ends.begin(), ends.end());
}

}  // namespace dsv41::text
