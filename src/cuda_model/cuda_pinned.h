// Page-locked host memory for the forward's host round trips (Engram rows staged before a step,
// index scores down and top-k selections up): copies from and to it are truly asynchronous and
// may be captured in a CUDA graph, which copies from pageable memory may not.
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "dsv41/ops/gpu_buffer.h"

namespace dsv41::model::cuda {

template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  ~PinnedArray() { release(); }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  // Replaces the contents with `n` uninitialised elements.
  void resize(size_t n) {
    if (n == n_) return;
    release();
    if (n == 0) return;
    void* p = nullptr;
    ops::gpu::check_cuda(cudaMallocHost(&p, n * sizeof(T)), "pinned host allocation");
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void release() {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace dsv41::model::cuda
#endif
