// Control-plane messages on the wire: a frame is [u32 type][u32 reserved][u64 payload bytes]
// followed by the payload, written with WireWriter and read with WireReader (little-endian
// integers, length-prefixed strings and arrays). Readers check every length against what is left,
// so a corrupt or hostile frame is one clear error, never an over-read.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dist/net.h"
#include "dsv41/common/error.h"

namespace dsv41::dist {

inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 32;  // a plan or reply never comes near

class WireWriter {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    u64(v.size());
    raw(v.data(), v.size() * sizeof(T));
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class WireReader {
 public:
  WireReader(const std::vector<uint8_t>& b, const char* what) : b_(b), what_(what) {}
  uint8_t u8() { return get<uint8_t>(); }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }
  int64_t i64() { return get<int64_t>(); }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <class T>
  std::vector<T> vec() {
    const uint64_t n = u64();
    DSV_CHECK(n <= (b_.size() - pos_) / sizeof(T), "{}: array of {} elements overruns the message", what_, n);
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), b_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  void done() const { DSV_CHECK(pos_ == b_.size(), "{}: {} trailing bytes", what_, b_.size() - pos_); }

 private:
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void need(uint64_t n) const {
    DSV_CHECK(n <= b_.size() - pos_, "{}: message truncated ({} bytes left, {} needed)", what_, b_.size() - pos_, n);
  }
  const std::vector<uint8_t>& b_;
  const char* what_;
  size_t pos_ = 0;
};

struct Frame {
  uint32_t type = 0;
  std::vector<uint8_t> payload;
};

inline void send_frame(const Socket& s, uint32_t type, const std::vector<uint8_t>& payload, const AbortCheck& abort,
                       int64_t deadline_ms, const char* what) {
  uint8_t hdr[16];
  const uint32_t zero = 0;
  const uint64_t n = payload.size();
  std::memcpy(hdr, &type, 4);
  std::memcpy(hdr + 4, &zero, 4);
  std::memcpy(hdr + 8, &n, 8);
  // One buffer, one send: frames from two threads sharing a socket are serialised by the caller.
  std::vector<uint8_t> all(hdr, hdr + 16);
  all.insert(all.end(), payload.begin(), payload.end());
  send_all(s, all.data(), all.size(), abort, deadline_ms, what);
}

inline Frame recv_frame(const Socket& s, const AbortCheck& abort, int64_t deadline_ms, const char* what) {
  uint8_t hdr[16];
  recv_all(s, hdr, 16, abort, deadline_ms, what);
  Frame f;
  uint64_t n = 0;
  std::memcpy(&f.type, hdr, 4);
  std::memcpy(&n, hdr + 8, 8);
  DSV_CHECK(n <= kMaxFrameBytes, "{}: frame of {} bytes is too large (not a dsv41-serve peer?)", what, n);
  f.payload.resize(n);
  if (n) recv_all(s, f.payload.data(), n, abort, deadline_ms, what);
  return f;
}

}  // namespace dsv41::dist
