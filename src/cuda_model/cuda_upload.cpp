#include "cuda_model/cuda_upload.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "dsv41/common/error.h"
#include "dsv41/common/parallel.h"

namespace dsv41::model::cuda {
namespace {

using ops::gpu::check_cuda;

// Host copies are split into pieces of this size across the thread pool: the source is usually
// memory-mapped checkpoint pages, whose first touch (page faults) is the slow part.
constexpr size_t kPieceBytes = size_t{1} << 20;

void parallel_copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  if (bytes < 2 * kPieceBytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const auto pieces = static_cast<int64_t>((bytes + kPieceBytes - 1) / kPieceBytes);
  parallel_for(pieces, [&](int64_t b, int64_t e) {
    const size_t from = static_cast<size_t>(b) * kPieceBytes;
    const size_t to = std::min(bytes, static_cast<size_t>(e) * kPieceBytes);
    std::memcpy(dst + from, src + from, to - from);
  });
}

}  // namespace

StagedUploader::StagedUploader(size_t slot_bytes, int slots) : slot_bytes_(slot_bytes), n_slots_(slots) {
  DSV_CHECK(slot_bytes_ > 0 && n_slots_ >= 2, "staged upload: {} slots of {} bytes", n_slots_, slot_bytes_);
}

void StagedUploader::init() {
  initialised_ = true;
  for (cudaStream_t& s : streams_)
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "staged upload: cudaStreamCreate");
  for (int i = 0; i < n_slots_; ++i) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, slot_bytes_, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      // Pinned memory can be limited (containers, locked-memory limits): plain copies still work.
      cudaGetLastError();
      spdlog::warn("weight upload: no pinned staging ({} x {} MiB: {}); copying synchronously", n_slots_,
                   slot_bytes_ >> 20, cudaGetErrorString(e));
      return;
    }
    pinned_.push_back(static_cast<uint8_t*>(p));
    cudaEvent_t ev = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "staged upload: cudaEventCreate");
    done_.push_back(ev);
    in_flight_.push_back(false);
  }
  slot_ = n_slots_ - 1;
  fill_ = slot_bytes_;  // the first upload moves to slot 0
}

StagedUploader::~StagedUploader() {
  for (cudaStream_t s : streams_)
    if (s) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  for (cudaEvent_t ev : done_) cudaEventDestroy(ev);
  for (uint8_t* p : pinned_) cudaFreeHost(p);
}

void StagedUploader::next_slot() {
  slot_ = (slot_ + 1) % n_slots_;
  if (in_flight_[static_cast<size_t>(slot_)]) {
    check_cuda(cudaEventSynchronize(done_[static_cast<size_t>(slot_)]), "staged upload: copy to device");
    in_flight_[static_cast<size_t>(slot_)] = false;
  }
  fill_ = 0;
}

void StagedUploader::upload(ops::gpu::DeviceBuffer& dst, const void* src, size_t bytes, size_t offset) {
  DSV_CHECK(offset + bytes <= dst.bytes(), "device upload of {} bytes at {} overruns a {}-byte buffer", bytes, offset,
            dst.bytes());
  if (bytes == 0) return;
  if (!initialised_) init();
  if (pinned_.size() < static_cast<size_t>(n_slots_) || done_.size() < static_cast<size_t>(n_slots_)) {
    dst.upload(src, bytes, offset);
    bytes_ += bytes;
    return;
  }
  const auto* from = static_cast<const uint8_t*>(src);
  auto* to = dst.as<uint8_t>() + offset;
  while (bytes > 0) {
    if (fill_ == slot_bytes_) next_slot();
    const auto s = static_cast<size_t>(slot_);
    const size_t n = std::min(bytes, slot_bytes_ - fill_);
    uint8_t* stage = pinned_[s] + fill_;
    parallel_copy(stage, from, n);
    // Each slot uses one stream, so the event recorded after its last copy covers all of them.
    cudaStream_t stream = streams_[s % 2];
    check_cuda(cudaMemcpyAsync(to, stage, n, cudaMemcpyHostToDevice, stream), "staged upload: cudaMemcpyAsync");
    check_cuda(cudaEventRecord(done_[s], stream), "staged upload: cudaEventRecord");
    in_flight_[s] = true;
    fill_ = std::min(slot_bytes_, (fill_ + n + 255) / 256 * 256);  // next piece 256-byte aligned
    from += n;
    to += n;
    bytes -= n;
    bytes_ += n;
  }
}

void StagedUploader::finish() {
  for (cudaStream_t s : streams_)
    if (s) check_cuda(cudaStreamSynchronize(s), "staged upload: copy to device");
  std::fill(in_flight_.begin(), in_flight_.end(), false);
}

}  // namespace dsv41::model::cuda
#endif
