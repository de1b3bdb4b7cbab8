// The scheduler's side of the runtime guards (issue 11): progress counters for the stall
// detector, preemption on request of the memory watchdog, and failing every open request when the
// engine is stuck. Called from the guards' threads, never from the loop.
#include <fmt/format.h>

#include "sched/scheduler.h"

namespace dsv41::sched {

bool Scheduler::request_preemption() {
  {
    std::lock_guard lk(mu_);
    if (stats_.running == 0) return false;
  }
  if (preempt_requested_.exchange(true)) return false;  // the previous one has not run yet
  {
    std::lock_guard lk(mu_);
    wake_ = true;
  }
  cv_.notify_all();
  return true;
}

void Scheduler::set_stalled(bool stalled, const std::string& reason) {
  std::vector<std::shared_ptr<TokenChannel>> open;
  {
    std::lock_guard lk(mu_);
    stalled_ = stalled;
    stalled_reason_ = reason;
    if (!stalled) return;
    for (auto& w : open_)
      if (auto c = w.lock()) open.push_back(std::move(c));
    open_.clear();
  }
  // The loop thread may be stuck inside the model and never get to these requests: end them
  // here. Finishing first makes the loop drop them (and their state) if it ever resumes; cancel
  // wakes it. Both take the channel's lock, and cancel takes mu_, so mu_ is not held here.
  const std::string msg = "the engine is not making progress (" + reason + "); retry later";
  for (auto& c : open) {
    c->finish(FinishReason::error, msg, /*retryable=*/true);
    c->cancel();
  }
}

std::string Scheduler::describe() const {
  const SchedulerStats s = stats();
  return fmt::format(
      "running {} waiting {} steps {} pending {}\nstate pool: {} of {} bytes used (peak {}), {} live states\n"
      "tokens: prompt {} generated {}; preemptions {}; finished stop {} length {} abort {} error {}\n",
      s.running, s.waiting, steps_done(), pending_.load(), s.pool_used_bytes, s.pool_capacity_bytes, s.pool_peak_bytes,
      s.live_states, s.prompt_tokens_total, s.generation_tokens_total, s.preemptions_total, s.finished_stop,
      s.finished_length, s.finished_abort, s.finished_error);
}

}  // namespace dsv41::sched
