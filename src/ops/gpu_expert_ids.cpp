// Argument validation of the tensor-parallel expert-id mapping (include/dsv41/ops/gpu_expert_ids.h).
#include "dsv41/ops/gpu_expert_ids.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_buffer.h"
#include "ops/expert_ids.h"

namespace dsv41::ops::gpu {

void local_expert_ids(const int32_t* global, int32_t* local, int64_t n, int32_t begin, int32_t end, cudaStream_t s) {
  DSV_CHECK(n >= 0 && begin >= 0 && begin <= end, "local_expert_ids: n={} experts [{}, {})", n, begin, end);
  DSV_CHECK(n == 0 || (global && local), "local_expert_ids: global and local must be device pointers");
  check_cuda(raw::local_expert_ids(global, local, n, begin, end, s), "local_expert_ids launch");
}

}  // namespace dsv41::ops::gpu
#endif
