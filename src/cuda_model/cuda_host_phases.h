// Host time of a decode step or a prefill pass by phase (DSV41_HOST_PHASES=1): where the host
// spends the wall time of a step, so host work that leaves the GPU idle can be told apart from GPU
// work. Off by default (one branch per phase); on, a log line every kReport decode steps (or
// kReportPasses prefill passes) of one row count gives each phase's mean per step.
#pragma once
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace dsv41::model::cuda {

enum class HostPhase : int {
  EngramPrepare,  // Engram hash ids and the row prefetch's issue
  EngramStage,    // Engram rows copied into pinned staging and their upload issued
  Uploads,        // tokens, pre, positions/pools uploads issued
  LayerIssue,     // the layers' kernel launches (without the top-k host points)
  TopkWait,       // waiting at a top-k host point for the GPU (scores download)
  TopkHost,       // the host top-k and the selections' upload issue
  HeadIssue,      // final collapse/norm/head launches and the logits download issue
  FinalSync,      // waiting for the step's end (GPU work left + the logits download)
  kCount
};

class HostPhaseTimer {
 public:
  using Clock = std::chrono::steady_clock;
  HostPhaseTimer() {
    const char* e = std::getenv("DSV41_HOST_PHASES");
    on_ = e && e[0] == '1';
  }
  bool on() const { return on_; }
  Clock::time_point now() const { return on_ ? Clock::now() : Clock::time_point{}; }
  // Adds now - since to the phase of the current step and returns now (the next phase's start).
  Clock::time_point add(HostPhase p, Clock::time_point since) {
    if (!on_) return since;
    const auto t = Clock::now();
    cur_[static_cast<size_t>(p)] += std::chrono::duration<double, std::milli>(t - since).count();
    return t;
  }
  // Time counted in `from` that belongs to another phase (the top-k points inside the layers).
  void exclude(HostPhase from, double ms) {
    if (on_) cur_[static_cast<size_t>(from)] -= ms;
  }
  double total(HostPhase p) const { return cur_[static_cast<size_t>(p)]; }  // so far in this step
  void end_step(int64_t rows, bool decode = true) {
    if (!on_) return;
    if (rows != rows_ || decode != decode_) {  // a report covers steps of one kind and row count:
      ms_.fill(0.0);                          // drop a partial run of another
      steps_ = 0;
      rows_ = rows;
      decode_ = decode;
    }
    for (size_t i = 0; i < ms_.size(); ++i) ms_[i] += cur_[i];
    cur_.fill(0.0);
    if (++steps_ < (decode ? kReport : kReportPasses)) return;
    const double k = 1.0 / static_cast<double>(steps_);
    double sum = 0;
    for (double v : ms_) sum += v;
    spdlog::info(
        "cuda host phases, mean of {} {} of {} rows (ms): engram prepare {:.4f}, engram stage {:.4f}, "
        "uploads {:.4f}, layer issue {:.4f}, top-k wait {:.4f}, top-k host {:.4f}, head issue {:.4f}, final sync "
        "{:.4f}; total {:.4f}",
        steps_, decode ? "decode steps" : "prefill passes", rows, ms_[0] * k, ms_[1] * k, ms_[2] * k, ms_[3] * k,
        ms_[4] * k, ms_[5] * k, ms_[6] * k, ms_[7] * k, sum * k);
    ms_.fill(0.0);
    steps_ = 0;
  }

 private:
  static constexpr int64_t kReport = 8, kReportPasses = 4;
  bool on_ = false, decode_ = true;
  std::array<double, static_cast<size_t>(HostPhase::kCount)> ms_{}, cur_{};
  int64_t steps_ = 0;
  int64_t rows_ = -1;
};

}  // namespace dsv41::model::cuda
