// Shared-memory limits per device (ops/smem_limit.h).
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "ops/smem_limit.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kMaxDevices = 64;

// DSV41_SMEM_PER_BLOCK, read once (0: unset or not a positive number).
size_t env_cap() {
  static const size_t cap = [] {
    const char* v = std::getenv("DSV41_SMEM_PER_BLOCK");
    if (!v || !*v) return size_t{0};
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    return end != v && *end == '\0' ? static_cast<size_t>(n) : size_t{0};
  }();
  return cap;
}

// Runs `f` with this thread in the relaxed stream-capture mode (attribute queries and changes are
// refused inside a global-mode capture), restoring the mode after.
template <class F>
cudaError_t relaxed(F&& f) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) return e;
  e = f();
  const cudaError_t restore = cudaThreadExchangeStreamCaptureMode(&mode);
  return e != cudaSuccess ? e : restore;
}

// The device's own opt-in limit, cached per device (0: unknown).
size_t device_optin(int dev) {
  static std::atomic<int> cached[kMaxDevices] = {};
  if (dev >= 0 && dev < kMaxDevices) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c > 0) return static_cast<size_t>(c);
  }
  int v = 0;
  const cudaError_t e =
      relaxed([&] { return cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev); });
  if (e != cudaSuccess || v <= 0) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < kMaxDevices) cached[dev].store(v, std::memory_order_relaxed);
  return static_cast<size_t>(v);
}

// A kernel's static shared memory (cudaFuncGetAttributes), cached per (kernel, device).
size_t static_smem(const void* fn, int dev) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> cache;
  const auto key = std::make_pair(fn, dev);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  cudaFuncAttributes attr{};
  if (relaxed([&] { return cudaFuncGetAttributes(&attr, fn); }) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = attr.sharedSizeBytes;
  return attr.sharedSizeBytes;
}

size_t limit_of(int dev) {
  const size_t limit = device_optin(dev), cap = env_cap();
  return cap > 0 && cap < limit ? cap : limit;
}

}  // namespace

size_t smem_per_block_limit() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return limit_of(dev);
}

size_t max_dynamic_smem(const void* fn) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  // Cached after the first call per device and kernel: launchers ask on every call.
  const size_t limit = limit_of(dev), fixed = static_smem(fn, dev);
  return limit > fixed ? limit - fixed : 0;
}

bool smem_fits(const void* fn, size_t dynamic_bytes) { return dynamic_bytes <= max_dynamic_smem(fn); }

cudaError_t raise_dynamic_smem(const void* fn, size_t dynamic_bytes) {
  if (!smem_fits(fn, dynamic_bytes)) return cudaErrorInvalidValue;
  return relaxed([&] {
    return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_bytes));
  });
}

}  // namespace dsv41::ops::gpu
