#include "model/engram_hash.h"

#include <cstring>
#include <limits>
#include <set>

#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::model {
namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

}  // namespace

std::vector<uint32_t> seed_sequence_state(uint64_t entropy, int n_words) {
  // The entropy integer as little-endian 32-bit words (0 -> one zero word).
  std::vector<uint32_t> ent;
  if (entropy == 0) ent.push_back(0);
  while (entropy > 0) {
    ent.push_back(static_cast<uint32_t>(entropy & 0xFFFFFFFFu));
    entropy >>= 32;
  }
  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < static_cast<int>(ent.size()) ? ent[i] : 0u, hash_const);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPoolSize; src < ent.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(ent[src], hash_const));

  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hc = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hc;
    hc *= kMultB;
    v *= hc;
    v ^= v >> kXShift;
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

namespace {
using u128 = unsigned __int128;
const u128 kPcgMult = (static_cast<u128>(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;
}  // namespace

Pcg64::Pcg64(uint64_t entropy) {
  const std::vector<uint32_t> w = seed_sequence_state(entropy, 8);
  // generate_state(4, uint64): consecutive word pairs, little-endian.
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = static_cast<uint64_t>(w[2 * i]) | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  const u128 seed = (static_cast<u128>(v[0]) << 64) | v[1];
  const u128 seq = (static_cast<u128>(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (seq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += seed;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t Pcg64::next_u64() {
  state_ = state_ * kPcgMult + inc_;
  const uint64_t hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  const uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t Pcg64::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  const uint64_t v = next_u64();
  has_u32_ = true;
  u32_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v);
}

int64_t Pcg64::integers(int64_t high) {
  DSV_ASSERT(high > 0, "integers(high={})", high);
  const uint64_t rng = static_cast<uint64_t>(high - 1);
  if (rng == 0) return 0;
  if (rng <= 0xFFFFFFFFull) {
    // numpy's 32-bit buffered Lemire path for small ranges.
    const uint32_t r32 = static_cast<uint32_t>(rng);
    if (r32 == 0xFFFFFFFFu) return next_u32();
    const uint32_t excl = r32 + 1;
    uint64_t m = static_cast<uint64_t>(next_u32()) * excl;
    uint32_t left = static_cast<uint32_t>(m);
    if (left < excl) {
      const uint32_t threshold = (0xFFFFFFFFu - r32) % excl;
      while (left < threshold) {
        m = static_cast<uint64_t>(next_u32()) * excl;
        left = static_cast<uint32_t>(m);
      }
    }
    return static_cast<int64_t>(m >> 32);
  }
  if (rng == 0xFFFFFFFFFFFFFFFFull) return static_cast<int64_t>(next_u64());
  const uint64_t excl = rng + 1;
  u128 m = static_cast<u128>(next_u64()) * excl;
  uint64_t left = static_cast<uint64_t>(m);
  if (left < excl) {
    const uint64_t threshold = (0xFFFFFFFFFFFFFFFFull - rng) % excl;
    while (left < threshold) {
      m = static_cast<u128>(next_u64()) * excl;
      left = static_cast<uint64_t>(m);
    }
  }
  return static_cast<int64_t>(m >> 64);
}

std::vector<EngramLayerHash> build_engram_hashes(const ModelConfig& c) {
  std::vector<EngramLayerHash> out;
  if (c.engram_layer_ids.empty()) return out;
  DSV_CHECK(c.engram_compressed_vocab_size > 0, "config: engram_compressed_vocab_size must be positive");
  const int64_t n_sizes = c.engram_max_ngram_size - 1;
  std::set<int64_t> seen;
  const int64_t max_long = std::numeric_limits<int64_t>::max();
  const int64_t bound = std::max<int64_t>(1, (max_long / c.engram_compressed_vocab_size) / 2);
  for (size_t li = 0; li < c.engram_layer_ids.size(); ++li) {
    EngramLayerHash h;
    for (int64_t n = 0; n < n_sizes; ++n) {
      int64_t current = c.engram_vocab_size - 1;
      for (int64_t head = 0; head < c.engram_n_heads; ++head) {
        int64_t cand = current + 1;
        while (!is_prime(cand) || seen.count(cand)) ++cand;
        seen.insert(cand);
        current = cand;
        h.primes.push_back(cand);
      }
    }
    int64_t sum = 0;
    for (int64_t p : h.primes) {
      h.offsets.push_back(sum);
      sum += p;
    }
    h.total_rows = sum;
    DSV_CHECK(li < c.engram_num_embeddings.size() && c.engram_num_embeddings[li] == sum,
              "config: engram layer {} has {} table rows by its primes, but engram_num_embeddings says {}",
              c.engram_layer_ids[li], sum,
              li < c.engram_num_embeddings.size() ? c.engram_num_embeddings[li] : -1);
    Pcg64 rng(static_cast<uint64_t>(10007 * c.engram_layer_ids[li]));
    for (int64_t k = 0; k < c.engram_max_ngram_size; ++k) h.multipliers.push_back(rng.integers(bound) * 2 + 1);
    out.push_back(std::move(h));
  }
  return out;
}

void engram_hash_ids(const EngramLayerHash& h, const ModelConfig& c, const int64_t* history, int64_t pad,
                     int64_t* out_rows) {
  const int64_t n = c.engram_max_ngram_size;
  bool blocked = false;
  int64_t rolling = 0;
  for (int64_t k = 0; k < n; ++k) {
    blocked = blocked || history[k] < 0;
    const int64_t tok = blocked ? pad : history[k];
    const int64_t prod = tok * h.multipliers[static_cast<size_t>(k)];
    if (k == 0) {
      rolling = prod;
      continue;
    }
    rolling ^= prod;
    for (int64_t head = 0; head < c.engram_n_heads; ++head) {
      const size_t col = static_cast<size_t>((k - 1) * c.engram_n_heads + head);
      out_rows[col] = h.offsets[col] + rolling % h.primes[col];
    }
  }
}

std::vector<int32_t> load_engram_token_map(const std::string& path, const ModelConfig& c, int64_t* pad) {
  DSV_CHECK(!path.empty(), "this model has Engram layers: pass the token map with --engram-token-map FILE");
  auto f = SafetensorsFile::open(path);
  const TensorInfo* t = f->find("token_map");
  DSV_CHECK(t != nullptr, "{}: no tensor named token_map", path);
  DSV_CHECK(t->dtype == DType::I32 && t->shape == std::vector<int64_t>({c.vocab_size}),
            "{}: token_map must be I32 [{}], got {} {}", path, c.vocab_size, dtype_name(t->dtype), t->shape_str());
  std::vector<int32_t> map(static_cast<size_t>(c.vocab_size));
  std::memcpy(map.data(), t->data, map.size() * 4);
  for (int32_t v : map)
    DSV_CHECK(v >= 0 && v < c.engram_compressed_vocab_size,
              "{}: token_map value {} outside [0, engram_compressed_vocab_size={})", path, v,
              c.engram_compressed_vocab_size);
  DSV_CHECK(c.engram_pad_token_id >= 0 && c.engram_pad_token_id < c.vocab_size,
            "config: engram_pad_token_id {} out of range", c.engram_pad_token_id);
  *pad = map[static_cast<size_t>(c.engram_pad_token_id)];
  return map;
}

}  // namespace dsv41::model
