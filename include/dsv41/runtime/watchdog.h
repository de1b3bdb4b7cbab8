// Runtime memory watchdog. Samples available memory every `period`; when it drops below the
// margin the process stops admitting new requests (the server answers 503 + Retry-After), then
// runs the registered relief actions in order (shrink caches, preempt the youngest sequences, ...)
// until memory is back above the margin. Admission resumes only once available memory is above
// margin + hysteresis, so a process hovering at the edge does not flap. Everything is logged with
// the numbers that caused it.
//
// Use from the server/engine:
//   MemoryWatchdog wd(meminfo_source(), {.margin_bytes = gib_to_bytes(opt.memory_margin_gib, ...)});
//   wd.add_action("shrink caches", [&](const LowMemory& m) { return cache.shrink(...); });
//   wd.add_action("preempt youngest sequence", [&](const LowMemory& m) { return sched.preempt_youngest(); });
//   wd.start();                                  // background sampling thread
//   if (auto a = wd.admission(); !a.admit) -> 503, header Retry-After: a.retry_after_s
//   engine, per long-prefill chunk: if (wd.check_now() == MemoryState::low) stop/yield the chunk.
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

#include "dsv41/runtime/memory_source.h"

namespace dsv41::runtime {

enum class MemoryState { ok, low };
const char* to_string(MemoryState s);

struct WatchdogConfig {
  uint64_t margin_bytes = 4 * kGiB;                     // below this: low
  uint64_t hysteresis_bytes = 1 * kGiB;                 // back to ok at margin + hysteresis
  std::chrono::milliseconds period{500};                // sampling period of the background thread
  int retry_after_s = 5;                                // what a rejected client is told
};

// What an action is told when it runs.
struct LowMemory {
  uint64_t available_bytes = 0;
  uint64_t margin_bytes = 0;
  uint64_t deficit_bytes = 0;  // margin - available (> 0)
  std::string source;
};

// What an action did. `acted` = it freed or released something (false: nothing left to do, e.g.
// no cache to shrink). `what` is logged. Actions run on the sampling thread and are repeated every
// period while memory stays low, so an action whose release is asynchronous (e.g. a preemption
// the engine carries out at its next step) should report acted=false while its previous release
// is still pending, or the watchdog escalates (preempts more) before the first one took effect.
struct ActionResult {
  bool acted = false;
  std::string what;
};

using ReliefAction = std::function<ActionResult(const LowMemory&)>;

struct Admission {
  bool admit = true;
  int retry_after_s = 0;
  std::string reason;  // empty when admitting
};

class MemoryWatchdog {
 public:
  MemoryWatchdog(MemorySource source, WatchdogConfig config);
  ~MemoryWatchdog();
  MemoryWatchdog(const MemoryWatchdog&) = delete;
  MemoryWatchdog& operator=(const MemoryWatchdog&) = delete;

  // Register before start(). Actions run in registration order while memory is low; after each,
  // memory is sampled again and the remaining actions are skipped once above the margin.
  void add_action(std::string name, ReliefAction action);
  // Called (from the sampling thread) on every ok<->low transition.
  void on_state_change(std::function<void(MemoryState)> fn);

  void start();  // background sampling thread
  void stop();   // joins the thread; idempotent

  // One sample + reaction, synchronously. The background thread calls this every period; the
  // engine may call it per prefill chunk. Never throws: an unreadable source is logged and the
  // previous state is kept.
  MemoryState check_now();

  MemoryState state() const { return low_.load() ? MemoryState::low : MemoryState::ok; }
  bool admitting() const { return !low_.load(); }
  Admission admission() const;
  uint64_t last_available_bytes() const { return last_available_.load(); }
  const WatchdogConfig& config() const { return config_; }
  // Counters for /health and tests.
  uint64_t samples() const { return samples_.load(); }
  uint64_t low_episodes() const { return low_episodes_.load(); }
  uint64_t source_errors() const { return source_errors_.load(); }
  std::string last_reason() const;

 private:
  bool read(MemoryReading& out);
  void run_loop();
  void notify(MemoryState s);

  MemorySource source_;
  WatchdogConfig config_;
  struct Named {
    std::string name;
    ReliefAction fn;
  };
  std::vector<Named> actions_;
  std::vector<std::function<void(MemoryState)>> listeners_;

  std::mutex check_mu_;  // one check at a time (thread + engine)
  mutable std::mutex reason_mu_;
  std::string reason_;
  std::atomic<bool> low_{false};
  std::atomic<uint64_t> last_available_{0};
  std::atomic<uint64_t> samples_{0}, low_episodes_{0}, source_errors_{0};

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dsv41::runtime
