// cp.async wrappers (sm_80 and later; both sm_90a and sm_121a have them): 16- and 4-byte global ->
// shared copies that run in the background, grouped by commit_group and awaited by wait_group /
// wait_all. One set for every kernel that stages through shared memory (kernels/ops and
// kernels/exl3), so each form of the instruction is spelt once.
//
// Two orderings; each kernel keeps the one it was written with (moving the wrappers here left every
// kernel's device code unchanged):
//  - CpOrder::Fenced gives the instruction a "memory" clobber: the compiler keeps every ordinary load
//    and store on its side of it (the safe choice where plain accesses to the staged buffers sit near
//    the copies, as in mhc's element-by-element tails).
//  - CpOrder::Free leaves the clobber out: the compiler may move unrelated memory accesses across
//    the copies; the staged buffers are ordered by the __syncthreads of each pipeline stage (a
//    barrier is a compiler fence too).
// CpL2 is the L2 prefetch-size hint of a 16-byte copy (the L2 fetches the surrounding 128 or 256
// bytes as well); it never changes what is copied.
//
// The zfill forms take src_bytes: the first src_bytes of the 16 (or 4) are read from src and the
// rest written as zeros; src_bytes = 0 reads nothing (the kernels still pass a valid address then).
// The _if forms take a flag instead (all or nothing), evaluated after the destination address as
// the kernels that use them always did.
#pragma once
#include <cuda_runtime.h>

namespace dsv41::ops::gpu::dev {

enum class CpOrder { Fenced, Free };
enum class CpL2 { None, B128, B256 };

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

namespace cp_detail {
// The instructions, on a shared-space destination address. n: the src-size operand.
template <CpOrder O, CpL2 H>
__device__ __forceinline__ void copy16(unsigned d, const void* src) {
  if constexpr (O == CpOrder::Fenced) {
    static_assert(H == CpL2::None, "no fenced form with an L2 hint is in use");
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
  } else if constexpr (H == CpL2::None) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
  } else if constexpr (H == CpL2::B128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(d), "l"(src));
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(d), "l"(src));
  }
}
template <CpOrder O, CpL2 H>
__device__ __forceinline__ void copy16_n(unsigned d, const void* src, unsigned n) {
  if constexpr (O == CpOrder::Fenced) {
    static_assert(H == CpL2::None, "no fenced form with an L2 hint is in use");
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
  } else if constexpr (H == CpL2::None) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  } else if constexpr (H == CpL2::B128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
  }
}
// .ca: 4-byte copies cannot bypass L1.
template <CpOrder O>
__device__ __forceinline__ void copy4_n(unsigned d, const void* src, unsigned n) {
  if constexpr (O == CpOrder::Fenced) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n));
  }
}
}  // namespace cp_detail

// 16 bytes src -> dst (both 16-byte aligned), cached in L2 only (.cg).
template <CpOrder O = CpOrder::Fenced, CpL2 H = CpL2::None>
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  cp_detail::copy16<O, H>(shared_address(dst), src);
}

// 16 bytes, of which the first src_bytes come from src and the rest are zeros.
template <CpOrder O = CpOrder::Fenced, CpL2 H = CpL2::None>
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, unsigned src_bytes) {
  cp_detail::copy16_n<O, H>(shared_address(dst), src, src_bytes);
}
// 16 bytes from src when `valid`, else 16 zeros and nothing read.
template <CpOrder O = CpOrder::Fenced, CpL2 H = CpL2::None>
__device__ __forceinline__ void cp_async16_if(void* dst, const void* src, bool valid) {
  const unsigned d = shared_address(dst);
  cp_detail::copy16_n<O, H>(d, src, valid ? 16u : 0u);
}

// 4 bytes (4-byte aligned), of which the first src_bytes come from src.
template <CpOrder O = CpOrder::Fenced>
__device__ __forceinline__ void cp_async4_zfill(void* dst, const void* src, unsigned src_bytes) {
  cp_detail::copy4_n<O>(shared_address(dst), src, src_bytes);
}
// 4 bytes from src when `valid`, else 4 zeros and nothing read.
template <CpOrder O = CpOrder::Fenced>
__device__ __forceinline__ void cp_async4_if(void* dst, const void* src, bool valid) {
  const unsigned d = shared_address(dst);
  cp_detail::copy4_n<O>(d, src, valid ? 4u : 0u);
}

// Closes this thread's copies issued since the last commit into one group.
template <CpOrder O = CpOrder::Fenced>
__device__ __forceinline__ void cp_async_commit() {
  if constexpr (O == CpOrder::Fenced) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  } else {
    asm volatile("cp.async.commit_group;\n" ::);
  }
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N, CpOrder O = CpOrder::Fenced>
__device__ __forceinline__ void cp_async_wait() {
  if constexpr (O == CpOrder::Fenced) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  } else {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
  }
}

// Waits for all of this thread's copies, committed or not.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace dsv41::ops::gpu::dev
