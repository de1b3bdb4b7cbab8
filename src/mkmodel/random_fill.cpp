#include "mkmodel/random_fill.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"

namespace dsv41::mkmodel {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256** (a public-domain generator), seeded through splitmix64.
struct Xoshiro {
  uint64_t s[4];
  explicit Xoshiro(uint64_t seed) {
    for (auto& v : s) v = splitmix64(seed);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    const uint64_t r = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
};

// Inverse of the standard normal CDF by Newton's method on erfc (exact to fp32 precision).
double normal_quantile(double p) {
  double x = 0.0;
  for (int it = 0; it < 60; ++it) {
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    const double step = (cdf - p) / pdf;
    x -= std::clamp(step, -1.0, 1.0);
    if (std::fabs(step) < 1e-12) break;
  }
  return x;
}

const std::array<float, 65536>& quantiles() {
  static const std::array<float, 65536> q = [] {
    std::array<float, 65536> a{};
    for (int i = 0; i < 32768; ++i) {
      const float v = static_cast<float>(normal_quantile((i + 0.5) / 65536.0));
      a[i] = v;
      a[65535 - i] = -v;  // symmetric: exact zero mean
    }
    return a;
  }();
  return q;
}

// Calls f(i, u16) for n uniform 16-bit draws.
template <class F>
void for_each_u16(Xoshiro& rng, int64_t n, F&& f) {
  int64_t i = 0;
  while (i < n) {
    uint64_t r = rng.next();
    for (int j = 0; j < 4 && i < n; ++j, ++i, r >>= 16) f(i, static_cast<uint16_t>(r & 0xFFFF));
  }
}

void store_float(DType dt, uint8_t* out, int64_t i, float v) {
  switch (dt) {
    case DType::F32: std::memcpy(out + 4 * i, &v, 4); break;
    case DType::F16: { const uint16_t h = f32_to_f16_bits(v); std::memcpy(out + 2 * i, &h, 2); break; }
    case DType::BF16: { const uint16_t h = f32_to_bf16_bits(v); std::memcpy(out + 2 * i, &h, 2); break; }
    default: DSV_ASSERT(false, "store_float: dtype {} is not a float type", dtype_name(dt));
  }
}

}  // namespace

float normal_quantile16(uint16_t i) { return quantiles()[i]; }

uint64_t tensor_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  uint64_t s = h ^ (seed * 0xD1342543DE82EF95ull);
  return splitmix64(s);
}

void fill_chunk(const FillRule& rule, uint64_t tseed, int64_t numel, int64_t chunk, uint8_t* out) {
  const int64_t begin = chunk * kFillChunk;
  const int64_t n = std::min(numel, begin + kFillChunk) - begin;
  DSV_ASSERT(n > 0, "fill_chunk: chunk {} beyond {} elements", chunk, numel);
  uint64_t cs = tseed ^ (static_cast<uint64_t>(chunk) * 0x9E3779B97F4A7C15ull);
  Xoshiro rng(splitmix64(cs));
  const auto& q = quantiles();
  switch (rule.kind) {
    case FillKind::kConst:
      for (int64_t i = 0; i < n; ++i) store_float(rule.dtype, out, i, rule.mean);
      break;
    case FillKind::kNormal:
      if (rule.dtype == DType::F32) {
        for_each_u16(rng, n, [&](int64_t i, uint16_t u) {
          const float v = rule.mean + rule.std * q[u];
          std::memcpy(out + 4 * i, &v, 4);
        });
      } else {
        // 16-bit floats: the 65536 possible outputs are tabulated once per rule and thread.
        static thread_local FillRule cached{};
        static thread_local bool have = false;
        static thread_local std::array<uint16_t, 65536> bits;
        if (!have || cached.dtype != rule.dtype || cached.mean != rule.mean || cached.std != rule.std) {
          for (int u = 0; u < 65536; ++u) store_float(rule.dtype, reinterpret_cast<uint8_t*>(&bits[u]), 0, rule.mean + rule.std * q[u]);
          cached = rule;
          have = true;
        }
        for_each_u16(rng, n, [&](int64_t i, uint16_t u) { std::memcpy(out + 2 * i, &bits[u], 2); });
      }
      break;
    case FillKind::kRawBits: {
      const int64_t bytes = n * static_cast<int64_t>(dtype_size(rule.dtype));
      int64_t i = 0;
      for (; i + 8 <= bytes; i += 8) {
        const uint64_t r = rng.next();
        std::memcpy(out + i, &r, 8);
      }
      if (i < bytes) {
        const uint64_t r = rng.next();
        std::memcpy(out + i, &r, static_cast<size_t>(bytes - i));
      }
      break;
    }
    case FillKind::kE4m3Normal: {
      // Encoding a 16-bit quantile table once per call keeps this at table-lookup speed.
      static thread_local float cached_std = -1.0f;
      static thread_local std::array<uint8_t, 65536> codes;
      if (cached_std != rule.std) {
        for (int u = 0; u < 65536; ++u) codes[u] = f32_to_e4m3(rule.std * q[u]);
        cached_std = rule.std;
      }
      for_each_u16(rng, n, [&](int64_t i, uint16_t u) { out[i] = codes[u]; });
      break;
    }
    case FillKind::kE8m0: {
      const int span = 2 * rule.jitter + 1;
      for_each_u16(rng, n, [&](int64_t i, uint16_t u) {
        const int e = rule.exponent + (span > 1 ? static_cast<int>(u % span) - rule.jitter : 0);
        out[i] = static_cast<uint8_t>(std::clamp(e + 127, 0, 254));
      });
      break;
    }
    case FillKind::kSignedScale:
      for_each_u16(rng, n, [&](int64_t i, uint16_t u) {
        const float frac = static_cast<float>(u >> 1) / 32767.0f;  // [0, 1]
        const float mag = rule.std * (1.0f + rule.jitter_frac * (2.0f * frac - 1.0f));
        store_float(rule.dtype, out, i, (u & 1) ? -mag : mag);
      });
      break;
    case FillKind::kMarker:
      for (int64_t i = 0; i < n; ++i) std::memcpy(out + 4 * i, &rule.marker, 4);
      break;
  }
}

}  // namespace dsv41::mkmodel
