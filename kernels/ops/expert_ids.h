// Tensor parallelism's routed-expert ids: the router's global ids mapped to this rank's bank.
// Kept out of ops_launch.h so that adding it recompiled no other kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41::ops::gpu::raw {
// local[i] = global[i] - begin when begin <= global[i] < end, else -1 (another rank's expert: the
// bank kernels write zero rows for it), for i < n.
cudaError_t local_expert_ids(const int32_t* global, int32_t* local, int64_t n, int32_t begin, int32_t end,
                             cudaStream_t s);
}  // namespace dsv41::ops::gpu::raw
