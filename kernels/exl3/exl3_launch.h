// Host-side launch helpers shared by the EXL3 launchers (.cu files only).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "ops/smem_limit.h"

namespace dsv41::exl3::cuda {

// Programmatic dependent launch is on unless DSV41_EXL3_NO_PDL is set (a fallback switch for
// drivers or capture modes that reject the launch attribute).
inline bool pdl_enabled() {
  static const bool on = std::getenv("DSV41_EXL3_NO_PDL") == nullptr;
  return on;
}

// Launches `fn` with programmatic stream serialisation allowed: it may start while the previous
// kernel of the stream is finishing; every EXL3 kernel waits (griddepcontrol.wait) before it
// reads anything an earlier kernel writes.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*fn)(Params...), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                       Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, fn, args...);
  if (e == cudaErrorNotSupported && cfg.numAttrs) {  // a stream that cannot overlap kernels
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, fn, args...);
  }
  return e;
}

// Raises a kernel's dynamic shared-memory limit once per kernel (needed above 48 KB).
template <class Fn>
cudaError_t raise_smem_once(Fn fn, size_t bytes) {
  static std::mutex mu;
  static std::set<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(reinterpret_cast<const void*>(fn))) return cudaSuccess;
  const cudaError_t e = ops::gpu::raise_dynamic_smem(fn, bytes);  // refused beyond the device's limit
  if (e == cudaSuccess) done.insert(reinterpret_cast<const void*>(fn));
  return e;
}

// Resident blocks per SM of a kernel with `smem` bytes of dynamic shared memory and `threads`
// threads (0 when it cannot run). Planners ask on every call: cached per (kernel, device).
template <class Fn>
int resident_blocks_per_sm(Fn fn, size_t smem, int threads) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;
  const auto key = std::make_pair(reinterpret_cast<const void*>(fn), device);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  if (raise_smem_once(fn, smem) != cudaSuccess) return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads, smem) != cudaSuccess) return 0;
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = blocks;
  return blocks;
}

}  // namespace dsv41::exl3::cuda
