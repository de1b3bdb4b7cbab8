// Host launchers of the grouped EXL3 linear (planning and validation: src/ops/exl3_gpu.cpp) and
// its input kernel.
#include "exl3/exl3_gemm_inst.cuh"
#include "exl3/exl3_grouped.h"
#include "exl3/exl3_launch.h"

namespace dsv41::exl3::dev {

// One warp per (set, sorted row, 128-block): the source row times its matrix's suh, Hadamard, fp16.
__global__ void __launch_bounds__(kThreads) grouped_input_kernel(const cuda::GroupedInputParams p) {
  const int lane = threadIdx.x & 31;
  const int nb = p.k / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= p.sets * p.rows * nb) return;
  const int b = static_cast<int>(item % nb);
  const int64_t r = (item / nb) % p.rows;
  const bool second = item >= nb * p.rows;  // set 1 (selects: a dynamic index would go to local memory)
  const int src = p.src_row ? p.src_row[r] : static_cast<int>(r);
  const XSource xs{p.x, static_cast<int>(p.x_type), 0, src + 1, p.x_stride, p.x_cols,
                   (second ? p.mats[1] : p.mats[0])[p.matrix_of[r]].suh};
  float v[4];
  load4(xs, src, static_cast<int64_t>(b) * 128 + 4 * lane, v);
  __half2* dst = reinterpret_cast<__half2*>((second ? p.xh[1] : p.xh[0]) + r * p.k + b * 128 + 4 * lane);
  dst[0] = __floats2half2_rn(v[0], v[1]);
  dst[1] = __floats2half2_rn(v[2], v[3]);
}

}  // namespace dsv41::exl3::dev

namespace dsv41::exl3::cuda {

cudaError_t launch_grouped_input(const GroupedInputParams& p, cudaStream_t stream) {
  const int64_t items = p.sets * p.rows * (p.k / 128);
  if (items == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((items + dev::kWarps - 1) / dev::kWarps);
  dev::grouped_input_kernel<<<blocks, dev::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream) {
  if (p.ntiles == 0) return cudaSuccess;
  const dev::GroupedKernelFn fn = dev::kernel_table(p.bits).grouped[p.codebook][p.row_class - 1];
  const size_t smem = dev::large_smem_bytes(p.bits, p.row_class);
  const cudaError_t e = raise_smem_once(fn, smem);
  if (e != cudaSuccess) return e;
  fn<<<dim3(p.n / 128, p.ntiles), dev::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsv41::exl3::cuda
