// Device memory behind the CUDA backend's sequence states. A state holds two blocks taken from a
// std::pmr::memory_resource (the server's StatePool, whose upstream is the model's device memory;
// or plain cudaMalloc for heap states) and carves its buffers out of them as spans. The pointers
// are device addresses: the host only does arithmetic on them and hands them to CUDA calls.
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <utility>

namespace dsv41::model::cuda {

// Every buffer carved from a state block starts on this boundary (cudaMalloc's own guarantee, so
// vectorised kernels see the same alignment as with DeviceBuffer).
inline constexpr size_t kStateAlignment = 256;

inline int64_t state_align(int64_t bytes) {
  constexpr auto a = static_cast<int64_t>(kStateAlignment);
  return (bytes + a - 1) / a * a;
}

// A non-owning view of one buffer inside a state block (same accessors as DeviceBuffer).
struct StateSpan {
  void* p = nullptr;
  size_t n = 0;
  void* get() const { return p; }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  size_t bytes() const { return n; }
};

// One allocation from a memory resource, returned to it on destruction. Zero bytes allocate
// nothing (a state whose room holds no compressed entry yet).
class StateBlock {
 public:
  StateBlock() = default;
  StateBlock(std::pmr::memory_resource* memory, int64_t bytes);
  ~StateBlock() { release(); }
  StateBlock(const StateBlock&) = delete;
  StateBlock& operator=(const StateBlock&) = delete;
  StateBlock(StateBlock&& o) noexcept
      : memory_(std::exchange(o.memory_, nullptr)), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  StateBlock& operator=(StateBlock&& o) noexcept {
    if (this != &o) {
      release();
      memory_ = std::exchange(o.memory_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  // The span [offset, offset + bytes) of this block (null when bytes is 0).
  StateSpan span(int64_t offset, int64_t bytes) const;
  void* get() const { return p_; }
  size_t bytes() const { return n_; }

 private:
  void release();
  std::pmr::memory_resource* memory_ = nullptr;
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Device memory ordered on the model's stream: allocations come from a memory pool of `device`
// that keeps what it reserved (no round trip to the driver per state), frees are queued behind the
// kernels already submitted that may still read the buffer. Must be destroyed before the stream.
class StreamStateMemory final : public std::pmr::memory_resource {
 public:
  StreamStateMemory(int device, cudaStream_t stream);
  ~StreamStateMemory() override;
  StreamStateMemory(const StreamStateMemory&) = delete;
  StreamStateMemory& operator=(const StreamStateMemory&) = delete;

 private:
  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* p, size_t bytes, size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }

  int device_;
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;  // null: the device has no stream-ordered allocator (plain cudaMalloc)
};

// Plain cudaMalloc/cudaFree (cudaFree waits for the device): heap states of tools and tests, which
// may outlive the model that made them.
std::pmr::memory_resource& device_heap_memory();

}  // namespace dsv41::model::cuda
#endif
