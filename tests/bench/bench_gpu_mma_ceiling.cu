// The tensor-core ceiling the kernels here can reach: the mma.sync issue rate per operand type.
//
// The prefill GEMMs run on mma.sync (the instruction GB10 and the H200 share; wgmma is Hopper-only),
// while the issue's target is stated against the dense bf16 peak of the H200 (989 TFLOP/s, reached
// only through wgmma). This benchmark measures what mma.sync itself issues with nothing else in the
// way: on all SMs, 4 CTAs of 8 warps each, every warp runs kChains independent accumulator chains
// of kIters MMAs, once with every operand fixed in registers and once with A read from shared
// memory before each MMA (see mma_loop_kernel). Reported: TFLOP/s per shape and mode (2·M·N·K per
// MMA) and its share of 989 TFLOP/s. The operands are small powers of two, so each MMA adds a known
// value to each accumulator: every thread's sum is checked against the count of MMAs, and storing
// it keeps the compiler from dropping any.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr double kBf16Peak = 989e12;
constexpr int kChains = 8;       // independent accumulator tiles per warp
constexpr int kWarps = 8;        // per CTA
constexpr int kIters = 4096;     // MMAs per chain

enum class Shape { F16K16, Bf16K16, E4m3K32 };

// asm volatile, unlike the engine's tc::mma_f16 (ops/tc_block.cuh): a ceiling bench's MMAs must be
// issued as written, never merged or hoisted by the compiler.
template <Shape S>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  if constexpr (S == Shape::F16K16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else if constexpr (S == Shape::Bf16K16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
  }
}

// Operand words whose every element is 2^-(6 + j) (A, j = 0..3) and 1 (B) in the type's encoding.
// Chain c takes j = c % 4, so the chains' operands differ and no compiler can merge them (with one
// operand pair for all chains ptxas folded the e4m3 chains, whose MMAs it expands into several
// instructions); each MMA adds K·2^-(6+j) to every accumulator of chain c, exact in fp32 over the run.
template <Shape S>
__host__ __device__ constexpr uint32_t a_word(int j) {
  constexpr uint32_t f16[4] = {0x24002400u, 0x20002000u, 0x1C001C00u, 0x18001800u};
  constexpr uint32_t bf16[4] = {0x3C803C80u, 0x3C003C00u, 0x3B803B80u, 0x3B003B00u};
  constexpr uint32_t e4m3[4] = {0x08080808u, 0x04040404u, 0x02020202u, 0x01010101u};  // 2^-6 normal, the rest subnormal
  return S == Shape::F16K16 ? f16[j] : S == Shape::Bf16K16 ? bf16[j] : e4m3[j];
}
template <Shape S>
__host__ __device__ constexpr uint32_t one() {
  return S == Shape::F16K16 ? 0x3C003C00u : S == Shape::Bf16K16 ? 0x3F803F80u : 0x38383838u;
}
template <Shape S>
__host__ __device__ constexpr int k_of() {
  return S == Shape::E4m3K32 ? 32 : 16;
}

// kLoaded = false: every chain's operands sit in registers for the whole loop (the raw issue rate).
// kLoaded = true: each MMA's A word is read from shared memory (volatile: a load every step), as
// real kernels feed theirs, so nothing derived from the operands can be computed once outside the
// loop. (With fixed operands ptxas hoists the product of its multi-instruction e4m3 expansion out of
// the loop and the e4m3 rate reads far above what a kernel sees.) Chain c at step `it` takes
// j = (c + it) % 4 when loaded, j = c % 4 when fixed.
template <Shape S, bool kLoaded>
__global__ void __launch_bounds__(kWarps * 32) mma_loop_kernel(float* out, int iters) {
  // The operands depend on a kernel argument so that the compiler cannot fold them.
  const uint32_t flip = iters < 0 ? 1u : 0u, b = one<S>();
  __shared__ uint32_t s_a[4];
  if (threadIdx.x < 4) s_a[threadIdx.x] = a_word<S>(static_cast<int>(threadIdx.x)) ^ flip;
  __syncthreads();
  volatile uint32_t* sa = s_a;
  uint32_t a[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) a[c] = a_word<S>(c % 4) ^ flip;
  float acc[kChains][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[c][i] = 0.0f;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      const uint32_t av = kLoaded ? sa[(c + it) & 3] : a[c];
      mma<S>(acc[c], av, av, av, av, b, b);
    }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <Shape S, bool kLoaded>
void run(const char* name, int sms) {
  const int ctas = sms * 4, threads = kWarps * 32;
  float* d_out = nullptr;
  if (cudaMalloc(&d_out, sizeof(float) * ctas * threads) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    std::exit(1);
  }
  mma_loop_kernel<S, kLoaded><<<ctas, threads>>>(d_out, 64);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  mma_loop_kernel<S, kLoaded><<<ctas, threads>>>(d_out, kIters);
  cudaEventRecord(e1);
  if (cudaEventSynchronize(e1) != cudaSuccess) {
    std::fprintf(stderr, "%s: kernel failed: %s\n", name, cudaGetErrorString(cudaGetLastError()));
    std::exit(1);
  }
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  std::vector<float> h(static_cast<size_t>(ctas) * threads);
  cudaMemcpy(h.data(), d_out, sizeof(float) * h.size(), cudaMemcpyDeviceToHost);
  // each of a thread's 4 accumulators of chain c gains K·2^-(6 + j) per MMA
  double want = 0.0;
  for (int c = 0; c < kChains; ++c)
    for (int it = 0; it < kIters; ++it)
      want += 4.0 * k_of<S>() * std::ldexp(1.0, -(6 + (kLoaded ? (c + it) % 4 : c % 4)));
  for (float v : h)
    if (v != want) {
      std::fprintf(stderr, "%s: a thread's sum is %.4f, want %.4f\n", name, v, want);
      std::exit(1);
    }
  const double mmas = static_cast<double>(ctas) * kWarps * kChains * kIters;
  const double flops = mmas * 2.0 * 16 * 8 * k_of<S>();
  const double tflops = flops / (ms * 1e-3) / 1e12;
  std::printf("%-22s %-16s %9.3f ms %8.1f TFLOP/s %6.1f %% of the bf16 peak\n", name,
              kLoaded ? "A from shared" : "fixed operands", ms, tflops, 100.0 * tflops * 1e12 / kBf16Peak);
  cudaFree(d_out);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

int main() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::printf("%s, %d SMs, %d CTAs of %d warps per SM, %d chains per warp\n", p.name, p.multiProcessorCount, 4,
              kWarps, kChains);
  run<Shape::F16K16, false>("m16n8k16 f16 -> f32", p.multiProcessorCount);
  run<Shape::F16K16, true>("m16n8k16 f16 -> f32", p.multiProcessorCount);
  run<Shape::Bf16K16, false>("m16n8k16 bf16 -> f32", p.multiProcessorCount);
  run<Shape::Bf16K16, true>("m16n8k16 bf16 -> f32", p.multiProcessorCount);
  run<Shape::E4m3K32, false>("m16n8k32 e4m3 -> f32", p.multiProcessorCount);
  run<Shape::E4m3K32, true>("m16n8k32 e4m3 -> f32", p.multiProcessorCount);
  if (p.major == 9)
    std::printf("sm_90: ptxas expands each e4m3 mma.sync into F2FP conversions, two f16 HMMAs from zero and an\n"
                "FADD per accumulator; with fixed operands the product is computed once outside the loop, so only\n"
                "the row with A from shared memory is a rate.\n");
  return 0;
}
