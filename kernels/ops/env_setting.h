// Host-side kernel-selection settings (thresholds, forced tiles) that an environment variable may
// set at start-up and tests or benches may override at run time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace dsv41::ops::gpu {

// The integer in environment variable `name` when it parses and lies in [lo, hi], else `fallback`.
inline int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  if (const char* e = std::getenv(name)) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (end != e && v >= lo && v <= hi) return v;
  }
  return fallback;
}

// One setting in [lo, hi] (lo >= 0): read from `env` on first use (`fallback` when unset or out of
// range); set() clamps into the range and returns the previous value.
class EnvSetting {
 public:
  constexpr EnvSetting(const char* env, int64_t fallback, int64_t lo, int64_t hi)
      : env_(env), fallback_(fallback), lo_(lo), hi_(hi) {}
  int64_t get() {
    const int64_t v = value_.load(std::memory_order_relaxed);
    if (v >= 0) return v;
    int64_t expected = -1;
    value_.compare_exchange_strong(expected, env_int(env_, fallback_, lo_, hi_), std::memory_order_relaxed);
    return value_.load(std::memory_order_relaxed);
  }
  int64_t set(int64_t v) {
    const int64_t prev = get();
    value_.store(std::clamp(v, lo_, hi_), std::memory_order_relaxed);
    return prev;
  }

 private:
  const char* env_;
  int64_t fallback_, lo_, hi_;
  std::atomic<int64_t> value_{-1};  // -1: not read from the environment yet
};

}  // namespace dsv41::ops::gpu
