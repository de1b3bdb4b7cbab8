#include "sched/scheduler.h"

namespace dsv41::sched {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
    case FinishReason::none: break;
  }
  return "none";
}

bool TokenChannel::wait(std::vector<SampledToken>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.empty() || reason_ != FinishReason::none; });
  for (auto& t : pending_) out.push_back(std::move(t));
  pending_.clear();
  return reason_ != FinishReason::none;
}

void TokenChannel::cancel() {
  cancel_.store(true);
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    wake = on_cancel_;
  }
  if (wake) wake();
}

FinishReason TokenChannel::finish_reason() const {
  std::lock_guard lk(mu_);
  return reason_;
}

std::string TokenChannel::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

bool TokenChannel::retryable() const {
  std::lock_guard lk(mu_);
  return retryable_;
}

void TokenChannel::push(const SampledToken& t) {
  {
    std::lock_guard lk(mu_);
    if (reason_ != FinishReason::none) return;  // failed from outside (stall) while the step ran
    pending_.push_back(t);
  }
  cv_.notify_all();
}

void TokenChannel::finish(FinishReason r, std::string error, bool retryable) {
  {
    std::lock_guard lk(mu_);
    if (reason_ != FinishReason::none) return;
    reason_ = r;
    error_ = std::move(error);
    retryable_ = retryable;
    on_cancel_ = nullptr;  // the scheduler may be gone by the time a late cancel arrives
  }
  cv_.notify_all();
}

}  // namespace dsv41::sched
