// The runtime guards of a serving rank 0 (issue 11), wired to the scheduler and the API in one
// place so the server and the tests run the same wiring:
//  - memory watchdog: below the margin no request is admitted (503 + Retry-After), the scheduler
//    admits nothing and pauses prefill (checked every step, so per prefill chunk), and the
//    youngest running sequence is preempted until memory is back;
//  - stall detector: no engine step for --stall-timeout-s while work is pending -> a dump of all
//    threads to --log-dir, /health 503, and every open request fails with 503 naming the stall
//    (new ones too, until steps resume).
//
//   RuntimeGuards g(memory_source, watchdog_cfg, stall_cfg);
//   so.memory_ok = g.memory_gate();  Scheduler sched(model, so);  g.attach(sched);
//   g.api_hooks(api_options);  ...  g.start();  ...  g.stop();   (stop before the scheduler)
#pragma once
#include <functional>
#include <memory>

#include "dsv41/runtime/memory_source.h"
#include "dsv41/runtime/stall_detector.h"
#include "dsv41/runtime/watchdog.h"
#include "sched/scheduler.h"
#include "serve/api.h"

namespace dsv41::serve {

class RuntimeGuards {
 public:
  RuntimeGuards(runtime::MemorySource memory, runtime::WatchdogConfig watchdog, runtime::StallConfig stall);
  ~RuntimeGuards();
  RuntimeGuards(const RuntimeGuards&) = delete;
  RuntimeGuards& operator=(const RuntimeGuards&) = delete;

  // For SchedulerOptions::memory_ok: samples memory (and runs the relief actions) once per step.
  std::function<bool()> memory_gate();
  // Registers the preemption relief action and creates the stall detector on `s` (once).
  void attach(sched::Scheduler& s);
  // Admission, /health and nothing else of ApiOptions.
  void api_hooks(ApiOptions& o);
  void start();
  void stop();  // idempotent

  runtime::MemoryWatchdog& watchdog() { return watchdog_; }
  runtime::StallDetector* stall_detector() { return stall_.get(); }

 private:
  runtime::MemoryWatchdog watchdog_;
  runtime::StallConfig stall_config_;
  std::unique_ptr<runtime::StallDetector> stall_;
};

}  // namespace dsv41::serve
