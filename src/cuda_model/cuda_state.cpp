// Sequence state of the CUDA backend, on the device and sized once for max_context tokens: a bf16
// window ring per layer, and per KV source floor(max_context / ratio) compressed rows (bf16 QDQ4b
// values), as many index keys (bf16 QDQ4a values) where the layer owns them, and the fp32
// compressor carries of ratio > 1 (kv 0, score -inf, as the CPU engine starts them).
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include <cmath>

#include "dsv41/common/error.h"

namespace dsv41::model::cuda {

int64_t Impl::state_bytes() const {
  const ModelConfig& c = cfg;
  int64_t bytes = c.num_hidden_layers * c.sliding_window * c.head_dim * 2;
  for (const GpuBlock& b : blocks) {
    if (!b.has_compressor || b.ratio <= 0) continue;
    const int64_t cap = max_context / b.ratio;
    bytes += cap * c.head_dim * 2;
    if (b.has_index_keys) bytes += cap * c.index_head_dim * 2;
    if (b.ratio > 1) bytes += 2 * b.ratio * c.head_dim * 4;
  }
  return bytes;
}

std::unique_ptr<CudaSeqState> Impl::make_state() const {
  const ModelConfig& c = cfg;
  auto st = std::make_unique<CudaSeqState>();
  st->owner = this;
  st->capacity_tokens = max_context;
  const size_t ring = static_cast<size_t>(c.sliding_window * c.head_dim) * 2;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    st->ring.emplace_back(ring);
    ops::gpu::check_cuda(cudaMemset(st->ring.back().get(), 0, ring), "state ring clear");
  }
  st->kv.resize(static_cast<size_t>(c.num_hidden_layers));
  for (const GpuBlock& b : blocks) {
    if (!b.has_compressor || b.ratio <= 0) continue;
    GpuKvSource& k = st->kv[static_cast<size_t>(b.layer)];
    k.capacity = max_context / b.ratio;
    k.compressed = DeviceBuffer(static_cast<size_t>(k.capacity * c.head_dim) * 2);
    if (b.has_index_keys) k.index_keys = DeviceBuffer(static_cast<size_t>(k.capacity * c.index_head_dim) * 2);
    if (b.ratio > 1) {
      const size_t cnt = static_cast<size_t>(b.ratio * c.head_dim);
      k.carry_kv = DeviceBuffer::from(std::vector<float>(cnt, 0.0f));
      k.carry_score = DeviceBuffer::from(std::vector<float>(cnt, -INFINITY));
    }
  }
  // The clears and uploads above ran on the legacy stream, which the model's non-blocking stream
  // does not wait for.
  ops::gpu::check_cuda(cudaDeviceSynchronize(), "state setup");
  return st;
}

CudaSeqState& Impl::state_of(SeqState& s) const {
  auto* p = dynamic_cast<CudaSeqState*>(&s);
  DSV_CHECK(p != nullptr, "sequence state does not belong to the CUDA model");
  DSV_CHECK(p->owner == this, "sequence state was made by a different model");
  return *p;
}

}  // namespace dsv41::model::cuda
#endif
