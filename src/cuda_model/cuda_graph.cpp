// Segment graphs of decode steps (cuda_graph.h).
#include "cuda_model/cuda_graph.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_buffer.h"

namespace dsv41::model::cuda {
using ops::gpu::check_cuda;
namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

StepGraphs::~StepGraphs() {
  abandon();
  for (auto& [key, exec] : execs_) cudaGraphExecDestroy(exec);
}

void StepGraphs::begin(int64_t bucket) {
  DSV_ASSERT(!in_step_, "step graphs: a step began inside another");
  bucket_ = bucket;
  segment_ = 0;
  in_step_ = true;
  ++stats_.steps;
  resume();
}

void StepGraphs::resume() {
  DSV_ASSERT(in_step_ && !capturing_, "step graphs: resume outside a paused step");
  // Thread-local mode: only this thread's unsafe calls (synchronous copies, synchronisations)
  // are refused during the capture; other threads (engram prefetch, other models) go on.
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture begin");
  capturing_ = true;
  capture_start_ = Clock::now();
}

void StepGraphs::pause() {
  DSV_ASSERT(capturing_, "step graphs: pause without a capture");
  finish_segment();
  ++segment_;
}

void StepGraphs::split() {
  pause();
  resume();
}

void StepGraphs::end() {
  DSV_ASSERT(capturing_, "step graphs: end without a capture");
  finish_segment();
  in_step_ = false;
}

void StepGraphs::finish_segment() {
  cudaGraph_t graph = nullptr;
  capturing_ = false;
  check_cuda(cudaStreamEndCapture(stream_, &graph), "graph capture end");
  stats_.capture_ms += ms_since(capture_start_);
  size_t nodes = 0;
  const cudaError_t ce = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (ce != cudaSuccess) {
    cudaGraphDestroy(graph);
    check_cuda(ce, "graph nodes");
  }
  if (nodes == 0) {  // nothing ran between the two host points
    cudaGraphDestroy(graph);
    return;
  }
  const std::tuple<int64_t, int, size_t> key{bucket_, segment_, nodes};
  auto it = execs_.find(key);
  bool ready = false;
  if (it != execs_.end()) {
    cudaGraphExecUpdateResultInfo info{};
    const Clock::time_point t = Clock::now();
    const cudaError_t ue = cudaGraphExecUpdate(it->second, graph, &info);
    stats_.update_ms += ms_since(t);
    if (ue == cudaSuccess) {
      ready = true;
      ++stats_.updates;
    } else {
      cudaGetLastError();  // the failed update's error is expected: the topology changed
      cudaGraphExecDestroy(it->second);
      execs_.erase(it);
    }
  }
  if (!ready) {
    cudaGraphExec_t exec = nullptr;
    const Clock::time_point t = Clock::now();
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    stats_.instantiate_ms += ms_since(t);
    if (ie != cudaSuccess) {
      cudaGraphDestroy(graph);
      check_cuda(ie, "graph instantiate");
    }
    it = execs_.emplace(key, exec).first;
    ++stats_.instantiations;
  }
  cudaGraphDestroy(graph);
  const Clock::time_point t = Clock::now();
  check_cuda(cudaGraphLaunch(it->second, stream_), "graph launch");
  stats_.launch_ms += ms_since(t);
  ++stats_.graph_launches;
}

void StepGraphs::abandon() noexcept {
  if (capturing_) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    capturing_ = false;
  }
  in_step_ = false;
}

}  // namespace dsv41::model::cuda
#endif
