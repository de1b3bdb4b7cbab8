// Tensor parallelism inside the CUDA backend (include/dsv41/model/cuda_model.h). The split mirrors
// the CPU engine's (src/model/tp_parts.cpp, docs/TENSOR_PARALLEL.md): a split layer computes whole
// outputs (full-K dot products, the TP 1 arithmetic) for this rank's rows. Instead of gathering
// the parts, each rank writes its outputs at their TP 1 positions of a zeroed buffer and the ranks
// all-reduce it: every element is one rank's value plus exact zeros, so the result is the TP 1
// buffer bit for bit whatever order NCCL adds in. The routed experts use the same rule on the
// (token, slot) rows: this rank's bank writes zero rows for other ranks' experts (lin4 with id -1).
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include <cstring>

#include "dsv41/common/error.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

void Impl::tp_setup() {
  tp = opts.tp.get();
  if (!tp) return;
  tp_rank = tp->rank();
  tp_world = tp->world_size();
  DSV_CHECK(tp_world >= 1 && tp_rank >= 0 && tp_rank < tp_world, "tensor parallel: rank {} of world size {}", tp_rank,
            tp_world);
  if (tp_world == 1) {
    tp = nullptr;
    return;
  }
  DSV_CHECK(std::strcmp(tp->backend(), "nccl") == 0,
            "tensor parallelism on the CUDA backend needs the NCCL collective (device memory), got '{}'", tp->backend());
  DSV_CHECK(!opts.dspark,
            "tensor parallelism on the CUDA backend runs without the DSpark stages (not split yet); drop --dspark / "
            "--spec-method dspark or use --device cpu");
}

dist::Range Impl::tp_share(int64_t total, int64_t align, const char* what) const {
  const dist::Range r = dist::split_range(total, tp_rank, tp_world, align);
  DSV_CHECK(r.size() > 0,
            "tensor parallel: rank {} of {} gets no share of the {} ({} in units of {}); use fewer ranks", tp_rank,
            tp_world, what, total, align);
  return r;
}

void Impl::tp_zero(float* d, int64_t count) {
  gpu::check_cuda(cudaMemsetAsync(d, 0, static_cast<size_t>(count) * 4, stream), "tensor-parallel zero");
}

void Impl::tp_sum(float* d, int64_t count) {
  // The collective runs on its own stream: the buffer must be complete before it starts.
  gpu::check_cuda(cudaStreamSynchronize(stream), "tensor-parallel sync");
  tp->all_reduce_sum(d, static_cast<size_t>(count));
}

const int32_t* Impl::tp_local_expert_ids(const GpuBlock& b, int64_t pairs) {
  // The router's global ids stay in sc.ids for the combine (expert order); the banks take local
  // ids. The selection is small (pairs ints): it goes through the host.
  tp_ids_host.resize(static_cast<size_t>(pairs));
  gpu::check_cuda(cudaMemcpyAsync(tp_ids_host.data(), sc.ids, static_cast<size_t>(pairs) * 4, cudaMemcpyDeviceToHost,
                                  stream),
                  "expert ids download");
  gpu::check_cuda(cudaStreamSynchronize(stream), "expert ids");
  const int64_t e0 = b.expert_begin, e1 = b.expert_begin + b.w1.n;
  for (int32_t& e : tp_ids_host) e = e >= e0 && e < e1 ? static_cast<int32_t>(e - e0) : -1;
  DSV_ASSERT(tp_ids.bytes() >= static_cast<size_t>(pairs) * 4, "local expert ids: {} pairs exceed the buffer", pairs);
  gpu::check_cuda(cudaMemcpyAsync(tp_ids.as<int32_t>(), tp_ids_host.data(), static_cast<size_t>(pairs) * 4,
                                  cudaMemcpyHostToDevice, stream),
                  "local expert ids upload");
  // The host vector is reused by the next layer: the copy must have read it.
  gpu::check_cuda(cudaStreamSynchronize(stream), "local expert ids");
  return tp_ids.as<int32_t>();
}

}  // namespace dsv41::model::cuda
#endif
