// Validated entry point of the tensor-parallel expert-id mapping (kernels/ops/expert_ids.h), and
// the rule itself for host code and tests.
#pragma once
#include <cstdint>

#if DSV41_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace dsv41::ops {
// A rank's bank holds experts [begin, end): its local id of global expert e, -1 for other ranks'.
constexpr int32_t local_expert_id(int32_t e, int32_t begin, int32_t end) {
  return e >= begin && e < end ? e - begin : -1;
}
}  // namespace dsv41::ops

#if DSV41_HAS_CUDA
namespace dsv41::ops::gpu {
// local[i] = local_expert_id(global[i], begin, end) for i < n (device pointers). Throws
// dsv41::Error on bad arguments or a failed launch.
void local_expert_ids(const int32_t* global, int32_t* local, int64_t n, int32_t begin, int32_t end, cudaStream_t s);
}  // namespace dsv41::ops::gpu
#endif
