// Tensor parallelism's routed-expert ids on the device (kernels/ops/expert_ids.h): the ids the
// router wrote stay on the GPU, so a split MoE layer needs no host round trip.
#include "dsv41/ops/gpu_expert_ids.h"
#include "ops/expert_ids.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void local_expert_ids_kernel(const int32_t* global, int32_t* local, int64_t n, int32_t begin, int32_t end) {
  dev::pdl_enter();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    local[i] = local_expert_id(global[i], begin, end);
  }
}

}  // namespace

namespace raw {
cudaError_t local_expert_ids(const int32_t* global, int32_t* local, int64_t n, int32_t begin, int32_t end,
                             cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  launch_pdl(local_expert_ids_kernel, static_cast<unsigned>(blocks < 1024 ? blocks : 1024), 256, 0, s, global, local, n,
             begin, end);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
