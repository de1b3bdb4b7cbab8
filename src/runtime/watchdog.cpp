#include "dsv41/runtime/watchdog.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "dsv41/common/error.h"

namespace dsv41::runtime {

const char* to_string(MemoryState s) { return s == MemoryState::ok ? "ok" : "low"; }

MemoryWatchdog::MemoryWatchdog(MemorySource source, WatchdogConfig config)
    : source_(std::move(source)), config_(config) {
  DSV_CHECK(bool(source_), "memory watchdog: no memory source");
  DSV_CHECK(config_.period.count() > 0, "memory watchdog: period must be positive");
  DSV_CHECK(config_.retry_after_s > 0, "memory watchdog: Retry-After must be positive");
}

MemoryWatchdog::~MemoryWatchdog() { stop(); }

void MemoryWatchdog::add_action(std::string name, ReliefAction action) {
  DSV_CHECK(!thread_.joinable(), "memory watchdog: add actions before start()");
  DSV_CHECK(bool(action), "memory watchdog: action '{}' is empty", name);
  actions_.push_back({std::move(name), std::move(action)});
}

void MemoryWatchdog::on_state_change(std::function<void(MemoryState)> fn) {
  DSV_CHECK(!thread_.joinable(), "memory watchdog: add listeners before start()");
  listeners_.push_back(std::move(fn));
}

void MemoryWatchdog::notify(MemoryState s) {
  for (auto& fn : listeners_) {
    try {
      fn(s);
    } catch (const std::exception& e) {
      spdlog::error("memory watchdog: state listener failed: {}", e.what());
    }
  }
}

bool MemoryWatchdog::read(MemoryReading& out) {
  try {
    out = source_();
    samples_.fetch_add(1);
    last_available_.store(out.available_bytes);
    return true;
  } catch (const std::exception& e) {
    // A monitoring failure must not take the server down; it keeps the last known state.
    if (source_errors_.fetch_add(1) % 100 == 0) spdlog::warn("memory watchdog: cannot sample memory: {}", e.what());
    return false;
  }
}

MemoryState MemoryWatchdog::check_now() {
  std::lock_guard<std::mutex> lock(check_mu_);
  MemoryReading m;
  if (!read(m)) return state();
  const uint64_t margin = config_.margin_bytes;
  const bool was_low = low_.load();

  if (m.available_bytes >= margin) {
    if (was_low && m.available_bytes >= margin + config_.hysteresis_bytes) {
      low_.store(false);
      {
        std::lock_guard<std::mutex> r(reason_mu_);
        reason_.clear();
      }
      spdlog::info("memory watchdog: {} available ({}) is above margin {} + hysteresis {}: admitting requests again",
                   format_gib(m.available_bytes), m.source, format_gib(margin), format_gib(config_.hysteresis_bytes));
      notify(MemoryState::ok);
    }
    return state();
  }

  // Below the margin: first stop admitting (cheapest, no work lost), then relief actions in order.
  std::string why = fmt::format("available memory {} ({}) is below the margin {}", format_gib(m.available_bytes),
                                m.source, format_gib(margin));
  {
    std::lock_guard<std::mutex> r(reason_mu_);
    reason_ = why;
  }
  if (!was_low) {
    low_.store(true);
    low_episodes_.fetch_add(1);
    spdlog::warn("memory watchdog: {}: no longer admitting requests (503, Retry-After: {} s)", why,
                 config_.retry_after_s);
    notify(MemoryState::low);
  }
  for (auto& a : actions_) {
    LowMemory info{m.available_bytes, margin, margin - m.available_bytes, m.source};
    ActionResult res;
    try {
      res = a.fn(info);
    } catch (const std::exception& e) {
      spdlog::error("memory watchdog: action '{}' failed: {}", a.name, e.what());
      continue;
    }
    if (!res.acted) {
      spdlog::debug("memory watchdog: action '{}' had nothing to do", a.name);
      continue;
    }
    spdlog::warn("memory watchdog: {}: ran '{}': {}", why, a.name, res.what);
    if (!read(m)) break;
    if (m.available_bytes >= margin) {
      spdlog::info("memory watchdog: {} available after '{}'; remaining actions skipped",
                   format_gib(m.available_bytes), a.name);
      break;
    }
    why = fmt::format("available memory {} ({}) is below the margin {}", format_gib(m.available_bytes), m.source,
                      format_gib(margin));
  }
  return state();
}

Admission MemoryWatchdog::admission() const {
  if (!low_.load()) return {};
  return {false, config_.retry_after_s, last_reason()};
}

std::string MemoryWatchdog::last_reason() const {
  std::lock_guard<std::mutex> r(reason_mu_);
  return reason_;
}

void MemoryWatchdog::start() {
  DSV_CHECK(!thread_.joinable(), "memory watchdog: already started");
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { run_loop(); });
}

void MemoryWatchdog::stop() {
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    stopping_ = true;
  }
  loop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MemoryWatchdog::run_loop() {
  std::unique_lock<std::mutex> l(loop_mu_);
  while (!stopping_) {
    l.unlock();
    check_now();
    l.lock();
    loop_cv_.wait_for(l, config_.period, [this] { return stopping_; });
  }
}

}  // namespace dsv41::runtime
