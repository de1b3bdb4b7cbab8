// Tensor parallelism inside the CUDA backend (include/dsv41/model/cuda_model.h). The split mirrors
// the CPU engine's (src/model/tp_parts.cpp, docs/TENSOR_PARALLEL.md): a split layer computes whole
// outputs (full-K dot products, the TP 1 arithmetic) for this rank's rows. Instead of gathering
// the parts, each rank writes its outputs at their TP 1 positions of a zeroed buffer and the ranks
// all-reduce it: every element is one rank's value plus exact zeros, so the result is the TP 1
// buffer bit for bit whatever order NCCL adds in. The routed experts use the same rule on the
// (token, slot) rows: this rank's bank writes zero rows for other ranks' experts (lin4 with id -1).
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_expert_ids.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

void Impl::tp_setup() {
  dist::Collective* c = opts.tp.get();
  if (!c) return;
  tp_rank = c->rank();
  tp_world = c->world_size();
  DSV_CHECK(tp_world >= 1 && tp_rank >= 0 && tp_rank < tp_world, "tensor parallel: rank {} of world size {}", tp_rank,
            tp_world);
  if (tp_world == 1) return;
  tp = dynamic_cast<dist::DeviceCollective*>(c);
  DSV_CHECK(tp != nullptr,
            "tensor parallelism on the CUDA backend needs the NCCL collective (device memory), got '{}'", c->backend());
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
  // On the compute stream, after the kernels that wrote `d`: no host round trip.
  tp->all_reduce_sum_on(d, static_cast<size_t>(count), stream);
}

Impl::MoeRows Impl::moe_rows(const GpuBlock& b, int64_t n) const {
  if (!b.split) return {sc.sg, sc.su, sc.shared};
  // Under tensor parallelism the scratch holds m * (K + 1) routed rows and 2 * m * inter gate/up
  // values (cuda_load.cpp alloc_scratch).
  DSV_ASSERT(n <= sc.m && b.top_k <= std::max(cfg.num_experts_per_tok, cfg.dspark_topk()),
             "split MoE rows: {} tokens of {}, top-k {}", n, sc.m, b.top_k);
  return {sc.sg, sc.sg + n * cfg.moe_intermediate_size, sc.routed + n * b.top_k * cfg.hidden_size};
}

const int32_t* Impl::tp_local_expert_ids(const GpuBlock& b, int64_t pairs, int64_t count) {
  if (count < 0) count = b.w1.n;
  // The router's global ids stay in sc.ids for the combine (expert order); the banks take local ids.
  DSV_ASSERT(tp_ids.bytes() >= static_cast<size_t>(pairs) * 4, "local expert ids: {} pairs exceed the buffer", pairs);
  gpu::local_expert_ids(sc.ids, tp_ids.as<int32_t>(), pairs, static_cast<int32_t>(b.expert_begin),
                        static_cast<int32_t>(b.expert_begin + count), stream);
  return tp_ids.as<int32_t>();
}

namespace {
// Polls `query` (cudaStreamQuery / cudaEventQuery of the work waited for) until it is done,
// checking the collective between polls.
template <class Query>
void poll_until_done(dist::DeviceCollective& tp, Query query, const char* what) {
  for (int i = 0;; ++i) {
    const cudaError_t e = query();
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) gpu::check_cuda(e, what);
    tp.check_alive(what);
    dist::poll_backoff(i);
  }
}
}  // namespace

void Impl::sync_stream(const char* what) {
  if (!tp) gpu::check_cuda(cudaStreamSynchronize(stream), what);
  else poll_until_done(*tp, [&] { return cudaStreamQuery(stream); }, what);
}

void Impl::sync_event(cudaEvent_t ev, const char* what) {
  if (!tp) gpu::check_cuda(cudaEventSynchronize(ev), what);
  else poll_until_done(*tp, [&] { return cudaEventQuery(ev); }, what);
}

void Impl::step_done(const char* what) {
  sync_stream(what);
  if (tp) tp->settle();
}

}  // namespace dsv41::model::cuda
#endif
