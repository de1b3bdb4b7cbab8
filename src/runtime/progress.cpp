#include "dsv41/runtime/progress.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "dsv41/runtime/memory_source.h"

namespace dsv41::runtime {

Progress::Progress(std::string what, uint64_t total, bool unit_bytes, Mode mode, Sink sink)
    : what_(std::move(what)), total_(total), bytes_(unit_bytes), sink_(std::move(sink)) {
  terminal_ = mode == Mode::terminal || (mode == Mode::automatic && ::isatty(STDERR_FILENO));
  if (!sink_) {
    sink_ = [](const std::string& l, bool redraw) {
      if (redraw) {
        std::fprintf(stderr, "\r%s", l.c_str());
        std::fflush(stderr);
      } else {
        spdlog::info("{}", l);
      }
    };
  }
  start_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {
  }
}

std::string Progress::line(uint64_t done, bool final) const {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double frac = total_ ? double(std::min(done, total_)) / double(total_) : 1.0;
  int pct = int(frac * 100.0);
  std::string amount = bytes_ ? fmt::format("{:.1f}/{:.1f} GiB", double(done) / double(kGiB), double(total_) / double(kGiB))
                              : fmt::format("{}/{}", done, total_);
  std::string rate;
  if (secs > 0.05 && done > 0)
    rate = bytes_ ? fmt::format(", {:.2f} GiB/s", double(done) / double(kGiB) / secs)
                  : fmt::format(", {:.1f}/s", double(done) / secs);
  std::string tail;
  if (final)
    tail = fmt::format(", {:.1f} s", secs);
  else if (frac > 0.01 && frac < 1.0)
    tail = fmt::format(", ETA {:.0f} s", secs / frac * (1.0 - frac));
  if (terminal_) {
    constexpr int kWidth = 30;
    int filled = int(frac * kWidth);
    return fmt::format("[{}{}] {:3d}% {} {}{}{}", std::string(size_t(filled), '#'), std::string(size_t(kWidth - filled), '.'),
                       pct, what_, amount, rate, tail);
  }
  return fmt::format("{}: {:3d}% ({}{}{})", what_, pct, amount, rate, tail);
}

void Progress::emit(uint64_t, bool final) {
  std::lock_guard<std::mutex> l(mu_);
  if (finished_) return;
  // Read the counter under the lock so concurrent advances report monotonically.
  const uint64_t done = done_.load();
  auto now = std::chrono::steady_clock::now();
  if (final) {
    finished_ = true;
    sink_(line(done, true) + (terminal_ ? "\n" : ""), terminal_);
    return;
  }
  if (terminal_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    sink_(line(done, false), true);
    return;
  }
  int decile = total_ ? int(double(std::min(done, total_)) * 10.0 / double(total_)) : 10;
  if (decile <= last_decile_ || decile >= 10) return;  // 100 % is the final line
  last_decile_ = decile;
  sink_(line(done, false), false);
}

void Progress::advance(uint64_t n) { emit(done_.fetch_add(n) + n, false); }

void Progress::finish() { emit(done_.load(), true); }

StartupTimer::StartupTimer() : start_(std::chrono::steady_clock::now()), phase_start_(start_) {}

void StartupTimer::end_current(std::chrono::steady_clock::time_point now) {
  if (current_.empty()) return;
  double s = std::chrono::duration<double>(now - phase_start_).count();
  phases_.emplace_back(current_, s);
  spdlog::info("start-up: {} took {:.2f} s", current_, s);
  current_.clear();
}

void StartupTimer::begin(std::string phase) {
  auto now = std::chrono::steady_clock::now();
  end_current(now);
  current_ = std::move(phase);
  phase_start_ = now;
  spdlog::info("start-up: {}...", current_);
}

void StartupTimer::finish() {
  end_current(std::chrono::steady_clock::now());
  spdlog::info("{}", summary());
}

std::vector<std::pair<std::string, double>> StartupTimer::phases() const { return phases_; }

std::string StartupTimer::summary() const {
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string s = fmt::format("start-up took {:.2f} s", total);
  for (size_t i = 0; i < phases_.size(); ++i)
    s += fmt::format("{}{} {:.2f} s", i == 0 ? ": " : ", ", phases_[i].first, phases_[i].second);
  return s;
}

}  // namespace dsv41::runtime
