// XXH64 (the xxHash 64-bit algorithm, seed 0 by default), streaming. Used as the per-file
// checksum of packed Engram rows: fast enough (several GB/s) to verify 100 GB at start-up.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dsv41::engram {

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t n);
  uint64_t digest() const;  // does not change the state: more data may follow
  static uint64_t of(const void* data, size_t n, uint64_t seed = 0);

 private:
  uint64_t seed_, v_[4], total_ = 0;
  uint8_t buf_[32];
  size_t buffered_ = 0;
};

std::string hex64(uint64_t v);  // 16 lowercase hex digits

}  // namespace dsv41::engram
