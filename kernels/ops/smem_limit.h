// The shared memory a block may opt in to on the current device, and the one call that raises a
// kernel's dynamic shared-memory limit (kernels/ops/smem_limit.cu). Host code only.
//
// Why it is one place. The two GPUs differ: the H200 (sm_90) gives a block up to 227 KB, GB10
// (sm_121, the product's GPU) 99 KB. Every launcher that wants more than the default 48 KB asks
// here, so a layout that does not fit the device is refused (or, where a launcher has a smaller
// form, not chosen) instead of failing at launch. DSV41_SMEM_PER_BLOCK=<bytes> lowers the limit
// (it never raises it): ctest runs every GPU test a second time with GB10's 101376 bytes
// (cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_12x), so the choices and fallbacks GB10 takes are
// checked on the H200.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace dsv41::ops::gpu {

// Bytes of shared memory (static + dynamic) a block may use on the current device: the device's
// opt-in limit, lowered by DSV41_SMEM_PER_BLOCK. 0 when the device cannot be read.
size_t smem_per_block_limit();

// Whether `fn` can run with `dynamic_bytes` of dynamic shared memory under that limit (its static
// shared memory counted).
bool smem_fits(const void* fn, size_t dynamic_bytes);

// The most dynamic shared memory `fn` can have under that limit (0 when none).
size_t max_dynamic_smem(const void* fn);

// Raises `fn`'s dynamic shared-memory limit to `dynamic_bytes` on the current device, in the relaxed
// capture mode (a function attribute enqueues nothing, so a graph capture stays valid). Returns
// cudaErrorInvalidValue, leaving no error behind, when the bytes do not fit (smem_fits).
cudaError_t raise_dynamic_smem(const void* fn, size_t dynamic_bytes);

template <class Fn>
bool smem_fits(Fn* fn, size_t dynamic_bytes) {
  return smem_fits(reinterpret_cast<const void*>(fn), dynamic_bytes);
}
template <class Fn>
size_t max_dynamic_smem(Fn* fn) {
  return max_dynamic_smem(reinterpret_cast<const void*>(fn));
}
template <class Fn>
cudaError_t raise_dynamic_smem(Fn* fn, size_t dynamic_bytes) {
  return raise_dynamic_smem(reinterpret_cast<const void*>(fn), dynamic_bytes);
}

}  // namespace dsv41::ops::gpu
