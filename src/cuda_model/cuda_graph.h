// CUDA graphs of decode steps (issue 7): the stream work of a step between two host points is
// captured into segment graphs, and per (bucket, segment index, node count) one instantiated
// executable graph is kept and refreshed every step with cudaGraphExecUpdate: kernel parameters
// (positions, list lengths, grid sizes) change from step to step, the topology mostly does not.
// The node count tells the topologies of a segment apart (a compressor emitting an entry every
// ratio-th step adds launches, rows whose list lengths split differently add attention runs), so
// alternating topologies each keep their executable; an update that still fails (same count,
// other kernels) re-instantiates. A step is begin(), then pause()/resume() around each host point
// (the host waits for the launched segment, works, uploads eagerly), split() where the host should
// hand finished work to the GPU while it captures the next (a layer boundary), then end().
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <tuple>

#include "dsv41/model/cuda_model.h"

namespace dsv41::model::cuda {

// What the graphs of a model did so far (counters only grow; CudaModel::graph_stats).
using StepGraphStats = CudaGraphStats;

class StepGraphs {
 public:
  explicit StepGraphs(cudaStream_t stream) : stream_(stream) {}
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Starts a step of the given bucket (its batch size; solo and batched decode passes use distinct
  // keys): the stream's work from here is captured (thread-local mode) into segment 0.
  void begin(int64_t bucket);
  // Ends the current segment and launches it; the host may then synchronise and upload eagerly.
  void pause();
  // Starts capturing the next segment of the step.
  void resume();
  // pause() then resume() with no host wait: the GPU runs the finished segment while the host
  // captures the next one.
  void split();
  // Ends the last segment and launches it; the step's remaining work runs eagerly.
  void end();
  // Ends an open capture without launching it (a step that threw); never throws.
  void abandon() noexcept;

  bool capturing() const { return capturing_; }
  bool in_step() const { return in_step_; }
  const StepGraphStats& stats() const { return stats_; }

 private:
  void finish_segment();

  cudaStream_t stream_;
  std::map<std::tuple<int64_t, int, size_t>, cudaGraphExec_t> execs_;  // (bucket, segment, nodes)
  int64_t bucket_ = 0;
  int segment_ = 0;
  bool capturing_ = false, in_step_ = false;
  std::chrono::steady_clock::time_point capture_start_;
  StepGraphStats stats_;
};

// Runs abandon() when a step leaves by an exception while capturing.
class StepGraphGuard {
 public:
  explicit StepGraphGuard(StepGraphs* g) : g_(g) {}
  ~StepGraphGuard() {
    if (g_) g_->abandon();
  }
  StepGraphGuard(const StepGraphGuard&) = delete;
  StepGraphGuard& operator=(const StepGraphGuard&) = delete;

 private:
  StepGraphs* g_;
};

}  // namespace dsv41::model::cuda
#endif
