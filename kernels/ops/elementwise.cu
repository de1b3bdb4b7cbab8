// Small elementwise pieces of the model forward that no other op covers: the indexer's weight
// scaling bf16(v · s) (MODEL.md §5.4), computed with the reference's single fp32 product, and the
// per-query row-pool pointer arrays of sparse attention (filled on the device, so a forward needs
// no host upload for them).
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void scale_round_kernel(ScaleRoundArgs a) {
  dev::pdl_enter();
  const int64_t total = a.rows * a.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / a.cols, c = i % a.cols;
    float* v = a.x + r * a.stride + c;
    *v = dev::bf16_round(__fmul_rn(*v, a.scale));
  }
}

__global__ void fill_pointers_kernel(FillPointersArgs a) {
  dev::pdl_enter();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    a.dst[i] = a.value;
}

}  // namespace

namespace raw {
cudaError_t fill_pointers(const FillPointersArgs& a, cudaStream_t s) {
  if (a.n == 0) return cudaSuccess;
  const int64_t blocks = (a.n + 255) / 256;
  launch_pdl(fill_pointers_kernel, static_cast<unsigned>(blocks < 1024 ? blocks : 1024), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t scale_round(const ScaleRoundArgs& a, cudaStream_t s) {
  const int64_t total = a.rows * a.cols;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  launch_pdl(scale_round_kernel, static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
