// Programmatic dependent launch (PDL) for the op kernels in kernels/ops/*.cu.
//
// A decode step is a chain of short kernels: without PDL the GPU idles for the launch latency
// between each pair. launch_pdl() launches a kernel with programmatic stream serialisation, so it
// is set up (and its blocks may become resident) while the previous kernel of the stream is still
// running. That is race-free only because every kernel launched this way calls dev::pdl_wait()
// before any global memory read or write of data a kernel may write: pdl_wait returns once all
// earlier work of the stream has completed and its writes are visible (this also covers
// write-after-read: a buffer the previous kernel still reads is not written before it finished).
// The one exception is weights, which no kernel writes: some kernels start loading (or L2-
// prefetching) weight tiles before the wait, overlapping the previous kernel's tail (the Lin8
// GEMV's prefetch, the tensor-core Lin8 GEMM, dense_stream, dense_ring, the tiled dense kernel,
// the mix and the cluster norm).
//
// dev::pdl_launch_dependents() lets the NEXT kernel of the stream be scheduled; the op kernels call
// it right after pdl_wait (the next kernel waits for this one's completion anyway, so the trigger
// placement only affects when its blocks occupy SM slots, never correctness).
//
// Both device calls are no-ops when a kernel is launched plainly (<<<>>>), so a kernel may be
// launched either way. Host side: DSV41_NO_PDL=1 in the environment turns the attribute off (a
// fallback for drivers or capture modes that reject it); a stream that cannot take the attribute
// (cudaErrorNotSupported) gets a plain launch. Graph capture records the programmatic edge.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>

namespace dsv41::ops::gpu {

namespace dev {
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The usual kernel prologue: wait for the previous kernel, then let the next one be scheduled.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}
}  // namespace dev

inline bool pdl_enabled() {
  static const bool on = std::getenv("DSV41_NO_PDL") == nullptr;
  return on;
}

// Fills the PDL attribute into attrs[n] (when enabled) and returns the new attribute count; for
// launchers that build their own cudaLaunchConfig_t (cluster launches).
inline unsigned add_pdl_attribute(cudaLaunchAttribute* attrs, unsigned n) {
  if (!pdl_enabled()) return n;
  attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[n].val.programmaticStreamSerializationAllowed = 1;
  return n + 1;
}

// Launches fn<<<grid, block, smem, stream>>>(args...) with programmatic stream serialisation.
// Returns the launch's error (cudaSuccess when queued); like <<<>>>, a failed launch also leaves it
// for cudaGetLastError(). fn must begin with dev::pdl_wait() (or dev::pdl_enter()).
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*fn)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  cfg.attrs = attr;
  cfg.numAttrs = add_pdl_attribute(attr, 0);
  cudaError_t e = cudaLaunchKernelEx(&cfg, fn, args...);
  if (e == cudaErrorNotSupported && cfg.numAttrs != 0) {  // a stream that cannot overlap kernels
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    e = cudaLaunchKernelEx(&cfg, fn, args...);
  }
  return e;
}

}  // namespace dsv41::ops::gpu
