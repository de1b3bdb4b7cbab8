// Owning device allocation (RAII) for the CUDA backend and its tests, plus the one CUDA error check
// the op wrappers share. Available when the build has CUDA (DSV41_HAS_CUDA).
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace dsv41::ops::gpu {

// Throws dsv41::Error "<what>: CUDA error <name> (<text>)" when e is not cudaSuccess.
void check_cuda(cudaError_t e, const char* what);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` (at least 1) of device memory; throws dsv41::Error when that fails.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  void* get() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

  // Synchronous copies (start-up and tests); offsets and sizes in bytes, checked against the size.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;

  template <class T>
  static DeviceBuffer from(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T));
    return b;
  }
  template <class T>
  std::vector<T> to_host(size_t count, size_t offset_elems = 0) const {
    std::vector<T> v(count);
    download(v.data(), count * sizeof(T), offset_elems * sizeof(T));
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dsv41::ops::gpu
#endif
