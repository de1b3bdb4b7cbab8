// Small helpers shared by the EXL3 GPU tests: device buffers, random EXL3 matrices with a host
// copy (the CPU reference decodes the same bits), error norms.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dsv41/common/numeric.h"
#include "dsv41/exl3/decoder.h"
#include "dsv41/ops/exl3_gpu.h"

namespace dsv41::test {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  static DeviceBuffer from(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    cudaMemcpy(b.p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return b;
  }
  template <class T>
  std::vector<T> to_host(size_t count) const {
    std::vector<T> v(count);
    cudaMemcpy(v.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A random EXL3 linear: any trellis bit pattern is valid (EXL3.md §5.3).
struct RandomMatrix {
  int64_t k, n;
  int K, cb;
  std::vector<uint16_t> trellis, suh16, svh16, bias16;
  std::vector<float> suh, svh, bias;
  DeviceBuffer d_trellis, d_suh, d_svh, d_bias;

  RandomMatrix(int64_t k_, int64_t n_, int K_, int cb_, uint64_t seed, bool with_bias = false)
      : k(k_), n(n_), K(K_), cb(cb_) {
    std::mt19937_64 rng(seed);
    trellis.resize(static_cast<size_t>(k / 16) * (n / 16) * 16 * K);
    for (auto& t : trellis) t = static_cast<uint16_t>(rng());
    std::uniform_real_distribution<float> mag(0.5f, 1.5f);
    auto signed_scale = [&](float s) { return f16_round(((rng() & 1) ? -s : s) * mag(rng)); };
    for (int64_t i = 0; i < k; ++i) suh.push_back(signed_scale(0.05f));
    for (int64_t i = 0; i < n; ++i) svh.push_back(signed_scale(1.0f));
    if (with_bias)
      for (int64_t i = 0; i < n; ++i) bias.push_back(signed_scale(0.2f));
    for (float v : suh) suh16.push_back(f32_to_f16_bits(v));
    for (float v : svh) svh16.push_back(f32_to_f16_bits(v));
    for (float v : bias) bias16.push_back(f32_to_f16_bits(v));
    d_trellis = DeviceBuffer::from(trellis);
    d_suh = DeviceBuffer::from(suh16);
    d_svh = DeviceBuffer::from(svh16);
    if (with_bias) d_bias = DeviceBuffer::from(bias16);
  }

  ops::Exl3Matrix device() const {
    ops::Exl3Matrix w;
    w.trellis = d_trellis.as<uint16_t>();
    w.suh = d_suh.as<uint16_t>();
    w.svh = d_svh.as<uint16_t>();
    w.bias = bias.empty() ? nullptr : d_bias.as<uint16_t>();
    w.k = static_cast<int32_t>(k);
    w.n = static_cast<int32_t>(n);
    w.bits = K;
    w.codebook = cb;
    return w;
  }

  exl3::Exl3View view() const {
    exl3::Exl3View v;
    v.trellis = trellis.data();
    v.k = k;
    v.n = n;
    v.K = K;
    v.codebook = static_cast<exl3::Codebook>(cb);
    v.suh = suh.data();
    v.svh = svh.data();
    v.bias = bias.empty() ? nullptr : bias.data();
    return v;
  }
};

// ||a - b|| / ||b|| over the listed entries; NaN when a has non-finite values.
inline double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return NAN;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// Activations rounded to the storage type; returns the host values the device will see and the
// raw storage bytes.
inline std::vector<float> round_acts(std::vector<float> v, ops::ActType t, std::vector<uint8_t>& raw) {
  const size_t es = t == ops::ActType::F32 ? 4 : 2;
  raw.resize(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == ops::ActType::F32) {
      std::memcpy(&raw[i * 4], &v[i], 4);
    } else {
      const uint16_t h = t == ops::ActType::F16 ? f32_to_f16_bits(v[i]) : f32_to_bf16_bits(v[i]);
      v[i] = t == ops::ActType::F16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
      std::memcpy(&raw[i * 2], &h, 2);
    }
  }
  return v;
}

inline float act_to_f32(const uint8_t* p, ops::ActType t) {
  if (t == ops::ActType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == ops::ActType::F16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
}

inline size_t act_size(ops::ActType t) { return t == ops::ActType::F32 ? 4 : 2; }

}  // namespace dsv41::test
