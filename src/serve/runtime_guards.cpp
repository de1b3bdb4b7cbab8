#include "serve/runtime_guards.h"

#include "dsv41/common/error.h"
#include "dsv41/runtime/health.h"

namespace dsv41::serve {

RuntimeGuards::RuntimeGuards(runtime::MemorySource memory, runtime::WatchdogConfig watchdog, runtime::StallConfig stall)
    : watchdog_(std::move(memory), watchdog), stall_config_(std::move(stall)) {}

RuntimeGuards::~RuntimeGuards() { stop(); }

std::function<bool()> RuntimeGuards::memory_gate() {
  return [this] { return watchdog_.check_now() == runtime::MemoryState::ok; };
}

void RuntimeGuards::attach(sched::Scheduler& s) {
  DSV_CHECK(!stall_, "runtime guards: already attached to a scheduler");
  watchdog_.add_action("preempt the youngest sequence", [&s](const runtime::LowMemory&) {
    // Carried out at the scheduler's next step; while that is pending this reports false.
    const bool acted = s.request_preemption();
    return runtime::ActionResult{acted, acted ? "the youngest running sequence goes back to the queue"
                                              : "nothing to preempt (or a preemption is pending)"};
  });
  stall_ = std::make_unique<runtime::StallDetector>(
      stall_config_, [&s] { return s.work_pending(); }, [&s] { return s.steps_done(); });
  stall_->add_component("scheduler", [&s] { return s.describe(); });
  stall_->on_state_change([&s](bool healthy, const std::string& why) { s.set_stalled(!healthy, why); });
}

void RuntimeGuards::api_hooks(ApiOptions& o) {
  o.admission = [this] { return watchdog_.admission(); };
  o.runtime_health = [this] { return runtime::runtime_health(&watchdog_, stall_.get()); };
}

void RuntimeGuards::start() {
  watchdog_.start();
  if (stall_) stall_->start();
}

void RuntimeGuards::stop() {
  if (stall_) stall_->stop();
  watchdog_.stop();
}

}  // namespace dsv41::serve
