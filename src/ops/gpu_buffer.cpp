#include "dsv41/ops/gpu_buffer.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"

namespace dsv41::ops::gpu {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("{}: CUDA error {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  const cudaError_t e = cudaMalloc(&p_, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    p_ = nullptr;
    fail("device allocation of {} bytes failed: {} ({})", bytes, cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  DSV_CHECK(offset + bytes <= bytes_, "device upload of {} bytes at {} overruns a {}-byte buffer", bytes, offset, bytes_);
  if (bytes) check_cuda(cudaMemcpy(static_cast<char*>(p_) + offset, src, bytes, cudaMemcpyHostToDevice), "device upload");
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  DSV_CHECK(offset + bytes <= bytes_, "device download of {} bytes at {} overruns a {}-byte buffer", bytes, offset,
            bytes_);
  if (bytes) check_cuda(cudaMemcpy(dst, static_cast<const char*>(p_) + offset, bytes, cudaMemcpyDeviceToHost),
                        "device download");
}

}  // namespace dsv41::ops::gpu
#endif
