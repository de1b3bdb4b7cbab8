// The host side of a forward step that CUDA graphs need (cuda_graph.h): Engram rows staged for
// every Engram layer before the step's first kernel, and the host points inside a decode step
// (the index top-k), where the open graph segment is ended and launched before the host waits.
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

void Impl::engram_stage(const EngramPass& e, int64_t n) {
  const int64_t n_eng = static_cast<int64_t>(e.fetch.size());
  if (n_eng == 0 || n == 0) return;
  DSV_ASSERT(n <= sc.m, "Engram staging: {} rows in a scratch of {}", n, sc.m);
  const int64_t cols = cfg.n_engram_columns(), layer_bytes = n * cols * engram_row_bytes;
  // The pinned staging is rewritten only after the device has read the previous pass's rows (a
  // pass normally ends synchronised; one that threw may have left its upload queued).
  if (!engram_uploaded) gpu::check_cuda(cudaEventCreateWithFlags(&engram_uploaded, cudaEventDisableTiming), "event");
  else gpu::check_cuda(cudaEventSynchronize(engram_uploaded), "Engram staging reuse");
  for (int64_t k = 0; k < n_eng; ++k) {
    const std::vector<int64_t>& ids = e.rows[static_cast<size_t>(k)];
    DSV_ASSERT(static_cast<int64_t>(ids.size()) == n * cols, "Engram staging: layer {} has {} ids for {} rows", k,
               ids.size(), n * cols);
    e.fetch[static_cast<size_t>(k)]->copy_rows(std::span<const int64_t>(ids.data(), ids.size()),
                                               engram_host.data() + k * layer_bytes);
  }
  gpu::check_cuda(cudaMemcpyAsync(sc.engram_raw, engram_host.data(), static_cast<size_t>(n_eng * layer_bytes),
                                  cudaMemcpyHostToDevice, stream),
                  "Engram rows upload");
  gpu::check_cuda(cudaEventRecord(engram_uploaded, stream), "Engram upload event");
}

const uint8_t* Impl::engram_layer_rows(int64_t engram_index, int64_t n) const {
  return sc.engram_raw + engram_index * n * cfg.n_engram_columns() * engram_row_bytes;
}

StepGraphs* Impl::decode_graphs() const { return graphs_on && !tp ? graphs.get() : nullptr; }

void Impl::host_point_sync(const char* what) {
  if (graphs && graphs->capturing()) graphs->pause();
  sync_stream(what);
}

bool Impl::host_point_can_defer() const { return !(graphs && graphs->capturing()); }

void Impl::host_point_mark() {
  if (!scores_ready) gpu::check_cuda(cudaEventCreateWithFlags(&scores_ready, cudaEventDisableTiming), "event");
  gpu::check_cuda(cudaEventRecord(scores_ready, stream), "host point event");
}

void Impl::host_point_wait(const char* what) {
  DSV_ASSERT(host_point_can_defer(), "host point: a deferred wait inside a graph capture");
  sync_event(scores_ready, what);
}

void Impl::host_point_resume() {
  if (graphs && graphs->in_step() && !graphs->capturing()) graphs->resume();
}

void Impl::layer_boundary(StepGraphs* graph, int64_t i) {
  const int64_t layers = cfg.num_hidden_layers;
  if (!layer_timing) {
    if (graph && i > 0 && i < layers) graph->split();
    return;
  }
  const bool in_graph = graph && graph->capturing();
  if (in_graph) graph->pause();
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  gpu::check_cuda(cudaStreamIsCapturing(stream, &capturing), "layer timing: capture status");
  if (capturing == cudaStreamCaptureStatusNone) {  // an outer capture (none today) is left untimed
    if (layer_events.empty()) {
      layer_events.resize(static_cast<size_t>(layers + 1));
      for (cudaEvent_t& e : layer_events) gpu::check_cuda(cudaEventCreate(&e), "layer timing: event");
    }
    if (i == 0 || layer_marked.size() != static_cast<size_t>(layers + 1))
      layer_marked.assign(static_cast<size_t>(layers + 1), false);
    gpu::check_cuda(cudaEventRecord(layer_events[static_cast<size_t>(i)], stream), "layer timing: record");
    layer_marked[static_cast<size_t>(i)] = true;
  }
  if (in_graph) graph->resume();
}

std::vector<double> Impl::layer_times_ms() {
  const int64_t layers = cfg.num_hidden_layers;
  std::vector<double> ms;
  if (layer_marked.size() != static_cast<size_t>(layers + 1)) return ms;
  for (bool m : layer_marked)
    if (!m) return ms;
  gpu::check_cuda(cudaEventSynchronize(layer_events.back()), "layer timing: wait");
  for (int64_t L = 0; L < layers; ++L) {
    float t = 0.0f;
    const size_t i = static_cast<size_t>(L);
    gpu::check_cuda(cudaEventElapsedTime(&t, layer_events[i], layer_events[i + 1]), "layer timing: elapsed");
    ms.push_back(t);
  }
  return ms;
}

}  // namespace dsv41::model::cuda
#endif
