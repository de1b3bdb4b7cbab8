// Stall detector: if the step progress counter has not moved for `stall_after` while work is
// pending, the process is considered stalled: /health turns unhealthy (healthy() == false) and a
// diagnostic dump is written to `<dump_dir>/stall-r<rank>-<UTC time>-<pid>.txt` containing
//   1. the reason (seconds without progress, counter value),
//   2. each registered component's self-reported state (scheduler queues, engine step, NCCL
//      state, ...); a component that does not answer within `component_timeout` (e.g. it is
//      blocked on the lock of the stalled code) is reported as such instead of blocking the dump,
//   3. every thread of the process: id, name, kernel state, wait channel and call stack
//      (see thread_dump.h for what a stack line contains).
// One dump per stall episode; when progress resumes the process is healthy again (logged).
// Idle time (no pending work) never counts as a stall.
//
// Wiring: progress = the engine's step counter (atomic), work_pending = "the scheduler has
// running or waiting sequences" (rank 0) / "a step plan is being executed" (workers). Both are
// called from the detector's thread and must not block (read atomics).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dsv41::runtime {

struct StallConfig {
  std::chrono::milliseconds stall_after{60000};
  std::chrono::milliseconds period{1000};
  std::string dump_dir = "logs";
  int rank = 0;
  bool thread_stacks = true;
  std::chrono::milliseconds component_timeout{1000};
};

class StallDetector {
 public:
  StallDetector(StallConfig config, std::function<bool()> work_pending, std::function<uint64_t()> progress);
  ~StallDetector();
  StallDetector(const StallDetector&) = delete;
  StallDetector& operator=(const StallDetector&) = delete;

  // A component's state, as text (any number of lines). Thread-safe; may be called any time.
  void add_component(std::string name, std::function<std::string()> describe);
  // Called on every healthy<->stalled transition (from the checking thread, after the dump),
  // with the reason when stalled. Register before start().
  void on_state_change(std::function<void(bool healthy, const std::string& reason)> fn);

  void start();
  void stop();

  // One check (the background thread calls it every period). Returns healthy().
  bool check_now();

  bool healthy() const { return healthy_.load(); }
  // Why unhealthy ("" when healthy), for /health.
  std::string health_reason() const;
  // Path of the latest dump ("" if none yet) and the number written.
  std::string last_dump_path() const;
  uint64_t dumps() const { return dumps_.load(); }

  // Writes a dump now (also used when another rank asks for one). Returns the file's path;
  // throws dsv41::Error when the file cannot be written.
  std::string dump_now(const std::string& reason);

 private:
  std::string describe_components();
  void run_loop();

  StallConfig config_;
  std::function<bool()> work_pending_;
  std::function<uint64_t()> progress_;

  std::vector<std::function<void(bool, const std::string&)>> listeners_;
  void notify(bool healthy, const std::string& reason);

  std::mutex components_mu_;
  std::vector<std::pair<std::string, std::function<std::string()>>> components_;

  std::mutex check_mu_;
  bool have_progress_ = false;
  uint64_t last_progress_ = 0;
  std::chrono::steady_clock::time_point last_change_;

  mutable std::mutex status_mu_;
  std::string reason_, last_dump_;
  std::atomic<bool> healthy_{true};
  std::atomic<uint64_t> dumps_{0};

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dsv41::runtime
