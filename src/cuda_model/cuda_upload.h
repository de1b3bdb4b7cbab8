// Start-up weight uploads through pinned staging: host threads copy the source bytes (memory-mapped
// checkpoint pages or converted vectors) into a pinned slot with parallel_for while the slots filled
// before are copied to the device on two streams. The device receives exactly the bytes a plain
// cudaMemcpy of the same source would write; only the order of the copies and their overlap change.
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dsv41/ops/gpu_buffer.h"

namespace dsv41::model::cuda {

class StagedUploader {
 public:
  // `slots` pinned buffers of `slot_bytes` each (allocated on first use).
  explicit StagedUploader(size_t slot_bytes = size_t{64} << 20, int slots = 4);
  ~StagedUploader();  // waits for the copies still in flight, then frees the slots and streams
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  // Queues a copy of `bytes` from host `src` into `dst` at `offset`. Returns once `src` may be
  // reused or freed (its bytes are in pinned memory); the device copy completes by finish().
  void upload(ops::gpu::DeviceBuffer& dst, const void* src, size_t bytes, size_t offset = 0);
  // A new device buffer holding v's bytes (the staged counterpart of DeviceBuffer::from).
  template <class T>
  ops::gpu::DeviceBuffer from(const std::vector<T>& v) {
    ops::gpu::DeviceBuffer b(v.size() * sizeof(T));
    upload(b, v.data(), v.size() * sizeof(T));
    return b;
  }
  // Waits until every queued copy has reached the device; throws dsv41::Error on a CUDA error.
  void finish();
  uint64_t bytes_uploaded() const { return bytes_; }

 private:
  void next_slot();  // moves to the following slot once its earlier copies have completed
  void init();

  size_t slot_bytes_;
  int n_slots_;
  std::vector<uint8_t*> pinned_;
  std::vector<cudaEvent_t> done_;  // last copy out of each slot
  std::vector<bool> in_flight_;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  bool initialised_ = false;  // streams and slots are created on the first upload (after cudaSetDevice)
  int slot_ = -1;
  size_t fill_ = 0;  // bytes of the current slot already handed to a copy
  uint64_t bytes_ = 0;
};

}  // namespace dsv41::model::cuda
#endif
