// Op-level parity harness for the CUDA ops (STYLE.md §5): random inputs of the real DeepSeek-V4.1
// shapes and of the tiny fixture's shapes, the CPU reference engine's own functions as the oracle,
// NMSE thresholds per output dtype, NaN/inf at identical positions, exact equality for bit logic,
// and guard bytes around every output buffer (a kernel writing out of bounds trips them).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsv41/common/numeric.h"
#include "dsv41/config/model_config.h"
#include "dsv41/ops/gpu_buffer.h"
#include "dsv41/ops/gpu_ops.h"
#include "ops/smem_limit.h"

namespace dsv41::test {

using ops::gpu::DeviceBuffer;

// The two shape sets every op runs on.
struct Shapes {
  std::string name;
  ModelConfig cfg;
};
inline const std::vector<Shapes>& shape_sets() {
  static const std::vector<Shapes> s = {
      {"real", load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json")},
      {"tiny", load_model_config(std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model/config.json")},
  };
  return s;
}

// NMSE thresholds by output dtype: outputs rounded to bf16 may differ by an ulp where a libm value
// differs in its last fp32 bit; fp32 outputs carry only summation-order noise (none expected).
inline constexpr double kNmseBf16 = 1e-6;
inline constexpr double kNmseF32 = 1e-10;

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(g); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
  int64_t below(int64_t n) { return static_cast<int64_t>(g() % static_cast<uint64_t>(n)); }
  // bf16 values, normal with standard deviation sd
  std::vector<float> bf16_vec(size_t n, float sd = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = bf16_round(normal(sd));
    return v;
  }
  std::vector<float> f32_vec(size_t n, float sd = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(sd);
    return v;
  }
  // e4m3 bytes without the NaN codes
  std::vector<uint8_t> e4m3_bytes(size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) {
      do b = static_cast<uint8_t>(g()); while ((b & 0x7F) == 0x7F);
    }
    return v;
  }
  // E8M0 scales around 2^0 (lo..hi exponents)
  std::vector<uint8_t> e8m0_bytes(size_t n, int lo = 118, int hi = 126) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(lo + below(hi - lo + 1));
    return v;
  }
};

// A device buffer with guard zones on both sides; the payload starts poisoned (0xFF bytes = NaN
// for floats) so that an element the kernel fails to write shows up as a NaN mismatch.
class Guarded {
 public:
  static constexpr size_t kGuard = 256;
  static constexpr uint8_t kPattern = 0xA5;
  explicit Guarded(size_t bytes, uint8_t poison = 0xFF) : bytes_(bytes), buf_(bytes + 2 * kGuard) {
    std::vector<uint8_t> init(bytes + 2 * kGuard, kPattern);
    std::memset(init.data() + kGuard, poison, bytes);
    buf_.upload(init.data(), init.size());
  }
  template <class T>
  static Guarded from(const std::vector<T>& v) {
    Guarded g(v.size() * sizeof(T));
    g.buf_.upload(v.data(), v.size() * sizeof(T), kGuard);
    return g;
  }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(static_cast<char*>(buf_.get()) + kGuard); }
  template <class T>
  std::vector<T> host() const {
    std::vector<T> v(bytes_ / sizeof(T));
    buf_.download(v.data(), v.size() * sizeof(T), kGuard);
    return v;
  }
  // Poisons the payload again (the guards stay), so that a later launch must write every element.
  void poison(uint8_t value = 0xFF) {
    const std::vector<uint8_t> fill(bytes_, value);
    buf_.upload(fill.data(), fill.size(), kGuard);
  }
  // True when every payload byte still holds `value` (nothing was written since poison()).
  bool poisoned(uint8_t value = 0xFF) const {
    const std::vector<uint8_t> v = host<uint8_t>();
    for (uint8_t b : v)
      if (b != value) return false;
    return true;
  }
  // True when both guard zones are intact.
  bool guards_ok() const {
    std::vector<uint8_t> all(bytes_ + 2 * kGuard);
    buf_.download(all.data(), all.size());
    for (size_t i = 0; i < kGuard; ++i)
      if (all[i] != kPattern || all[kGuard + bytes_ + i] != kPattern) return false;
    return true;
  }

 private:
  size_t bytes_;
  DeviceBuffer buf_;
};

struct Compare {
  double nmse = 0.0;
  size_t mismatched_nonfinite = 0;  // NaN/inf at different positions or of different kind
  size_t exact = 0, total = 0;
};

inline Compare compare(const std::vector<float>& got, const std::vector<float>& want) {
  Compare c;
  c.total = want.size();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float a = got[i], b = want[i];
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      const bool same = (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0));
      if (!same) ++c.mismatched_nonfinite;
      else ++c.exact;
      continue;
    }
    if (std::memcmp(&a, &b, 4) == 0 || a == b) ++c.exact;
    num += (double(a) - b) * (double(a) - b);
    den += double(b) * b;
  }
  c.nmse = den > 0 ? num / den : num;
  return c;
}

// Asserts parity of one output: NaN/inf positions, NMSE under the threshold; logs the exact share.
inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                         double max_nmse) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const Compare c = compare(got, want);
  std::printf("  [parity] %-44s nmse=%.3e exact=%zu/%zu\n", what.c_str(), c.nmse, c.exact, c.total);
  EXPECT_EQ(c.mismatched_nonfinite, 0u) << what << ": NaN/inf at different positions";
  EXPECT_LE(c.nmse, max_nmse) << what;
}

template <class T>
inline void expect_equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (!bad) first = i;
      ++bad;
    }
  std::printf("  [exact]  %-44s %zu/%zu equal\n", what.c_str(), got.size() - bad, got.size());
  EXPECT_EQ(bad, 0u) << what << ": first difference at " << first;
}

inline void expect_guards(const std::string& what, const Guarded& g) { EXPECT_TRUE(g.guards_ok()) << what << ": guard bytes overwritten"; }

// Mean time of `reps` launches of fn on the default stream (printed for the real shapes).
template <class F>
inline double time_us(F fn, int reps = 10) {
  fn();
  cudaDeviceSynchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / reps;
}
inline void report_time(const std::string& what, double us) { std::printf("  [time]   %-44s %9.1f us\n", what.c_str(), us); }

inline void sync_ok() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// Whether a kernel layout of `bytes` of dynamic shared memory must run on this device (under its
// per-block limit, lowered to GB10's by DSV41_SMEM_PER_BLOCK in the suites' second run), must be
// refused (beyond it), or may go either way (within 1 KB of it: the kernel's static shared memory).
enum class SmemFit { kRuns, kRefused, kEither };
inline SmemFit smem_fit(size_t bytes) {
  const size_t limit = ops::gpu::smem_per_block_limit();
  if (bytes + 1024 <= limit) return SmemFit::kRuns;
  return bytes > limit ? SmemFit::kRefused : SmemFit::kEither;
}
// The launch status a layout of `bytes` must give: success where it must run, `refusal` (nothing
// launched) where it must be refused; either where either may happen.
inline void expect_smem_outcome(const std::string& what, cudaError_t e, size_t bytes, cudaError_t refusal) {
  const SmemFit fit = smem_fit(bytes);
  if (fit == SmemFit::kRuns) EXPECT_EQ(e, cudaSuccess) << what << ": " << bytes << " bytes of shared memory fit";
  else if (fit == SmemFit::kRefused) EXPECT_EQ(e, refusal) << what << ": " << bytes << " bytes exceed the limit";
  else EXPECT_TRUE(e == cudaSuccess || e == refusal) << what << ": " << cudaGetErrorString(e);
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16_bits(v[i]);
  return o;
}

// Random dense weights in a DenseType's values (bf16 or fp16 ones rounded from fp32, fp32 of full
// precision) and their device copy in that type.
struct DenseWeights {
  std::vector<float> values;
  DeviceBuffer device;
};
inline DenseWeights dense_weights(Rng& rng, ops::gpu::DenseType t, size_t n, float sd) {
  DenseWeights w;
  if (t == ops::gpu::DenseType::BF16) {
    w.values = rng.bf16_vec(n, sd);
    w.device = DeviceBuffer::from(to_bf16_bits(w.values));
  } else if (t == ops::gpu::DenseType::F16) {
    w.values = rng.f32_vec(n, sd);
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = f32_to_f16_bits(w.values[i]);
      w.values[i] = f16_bits_to_f32(bits[i]);
    }
    w.device = DeviceBuffer::from(bits);
  } else {
    w.values = rng.f32_vec(n, sd);
    w.device = DeviceBuffer::from(w.values);
  }
  return w;
}
inline const char* dense_type_name(ops::gpu::DenseType t) {
  return t == ops::gpu::DenseType::BF16 ? "linbf16" : t == ops::gpu::DenseType::F16 ? "linf16" : "linf32";
}
inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_bits_to_f32(v[i]);
  return o;
}

// The first `cols` values of each of `rows` rows of a strided device output; the gap columns
// between them must still hold Guarded's poison (NaN), or the kernel wrote past its row.
inline std::vector<float> strided_rows(const std::string& what, const Guarded& y, int64_t rows, int64_t stride,
                                       int64_t cols) {
  const std::vector<float> all = y.host<float>();
  std::vector<float> v(static_cast<size_t>(rows * cols));
  size_t gap_written = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = all[r * stride + c];
    for (int64_t c = cols; c < stride; ++c) gap_written += !std::isnan(all[r * stride + c]);
  }
  EXPECT_EQ(gap_written, 0u) << what << ": stride gap written";
  return v;
}

}  // namespace dsv41::test
