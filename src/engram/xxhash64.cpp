#include "dsv41/engram/xxhash64.h"

#include <fmt/format.h>

#include <cstring>

namespace dsv41::engram {

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL, kP3 = 0x165667B19E3779F9ULL,
                   kP4 = 0x85EBCA77C2B2AE63ULL, kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const uint8_t* p) {  // little-endian, like the reference definition
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round_(uint64_t acc, uint64_t lane) { return rotl(acc + lane * kP2, 31) * kP1; }
inline uint64_t merge(uint64_t h, uint64_t v) { return (h ^ round_(0, v)) * kP1 + kP4; }
}  // namespace

Xxh64::Xxh64(uint64_t seed) : seed_(seed) {
  v_[0] = seed + kP1 + kP2;
  v_[1] = seed + kP2;
  v_[2] = seed;
  v_[3] = seed - kP1;
}

void Xxh64::update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += n;
  if (buffered_ + n < 32) {
    std::memcpy(buf_ + buffered_, p, n);
    buffered_ += n;
    return;
  }
  if (buffered_ > 0) {
    const size_t take = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, take);
    for (int i = 0; i < 4; ++i) v_[i] = round_(v_[i], load64(buf_ + 8 * i));
    p += take;
    n -= take;
    buffered_ = 0;
  }
  uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
  while (n >= 32) {
    a = round_(a, load64(p));
    b = round_(b, load64(p + 8));
    c = round_(c, load64(p + 16));
    d = round_(d, load64(p + 24));
    p += 32;
    n -= 32;
  }
  v_[0] = a, v_[1] = b, v_[2] = c, v_[3] = d;
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, v_[i]);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const uint8_t* p = buf_;
  size_t n = buffered_;
  while (n >= 8) {
    h = rotl(h ^ round_(0, load64(p)), 27) * kP1 + kP4;
    p += 8;
    n -= 8;
  }
  if (n >= 4) {
    h = rotl(h ^ (static_cast<uint64_t>(load32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  while (n > 0) {
    h = rotl(h ^ (*p * kP5), 11) * kP1;
    ++p;
    --n;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t Xxh64::of(const void* data, size_t n, uint64_t seed) {
  Xxh64 x(seed);
  x.update(data, n);
  return x.digest();
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace dsv41::engram
