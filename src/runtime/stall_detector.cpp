#include "dsv41/runtime/stall_detector.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>

#include "dsv41/common/error.h"
#include "dsv41/runtime/thread_dump.h"

namespace dsv41::runtime {

StallDetector::StallDetector(StallConfig config, std::function<bool()> work_pending,
                             std::function<uint64_t()> progress)
    : config_(std::move(config)), work_pending_(std::move(work_pending)), progress_(std::move(progress)) {
  DSV_CHECK(bool(work_pending_) && bool(progress_), "stall detector: needs a work-pending predicate and a counter");
  DSV_CHECK(config_.stall_after.count() > 0 && config_.period.count() > 0,
            "stall detector: stall_after and period must be positive");
  DSV_CHECK(!config_.dump_dir.empty(), "stall detector: empty dump directory");
  if (config_.thread_stacks) install_thread_dump_handler();
  last_change_ = std::chrono::steady_clock::now();
}

StallDetector::~StallDetector() { stop(); }

void StallDetector::add_component(std::string name, std::function<std::string()> describe) {
  DSV_CHECK(bool(describe), "stall detector: component '{}' has no describe function", name);
  std::lock_guard<std::mutex> l(components_mu_);
  components_.emplace_back(std::move(name), std::move(describe));
}

std::string StallDetector::health_reason() const {
  std::lock_guard<std::mutex> l(status_mu_);
  return reason_;
}

std::string StallDetector::last_dump_path() const {
  std::lock_guard<std::mutex> l(status_mu_);
  return last_dump_;
}

bool StallDetector::check_now() {
  std::lock_guard<std::mutex> lock(check_mu_);
  auto now = std::chrono::steady_clock::now();
  uint64_t p = progress_();
  bool pending = work_pending_();
  if (!have_progress_ || p != last_progress_ || !pending) {
    // Progress, or nothing to do: the clock restarts. Idle never counts as a stall.
    bool moved = have_progress_ && p != last_progress_;
    have_progress_ = true;
    last_progress_ = p;
    last_change_ = now;
    if (!healthy_.load() && (moved || !pending)) {
      healthy_.store(true);
      {
        std::lock_guard<std::mutex> l(status_mu_);
        reason_.clear();
      }
      spdlog::warn("stall detector: {} (counter {}): healthy again", moved ? "progress resumed" : "no work pending",
                   p);
      notify(true, "");
    }
    return healthy_.load();
  }
  auto idle = now - last_change_;
  if (idle < config_.stall_after || !healthy_.load()) return healthy_.load();

  double secs = std::chrono::duration<double>(idle).count();
  std::string why = fmt::format("no step progress for {:.1f} s while work is pending (step counter {})", secs, p);
  {
    std::lock_guard<std::mutex> l(status_mu_);
    reason_ = "stalled: " + why;
  }
  healthy_.store(false);
  spdlog::error("stall detector: {}; /health now reports unhealthy", why);
  try {
    std::string path = dump_now(why);
    spdlog::error("stall detector: thread and component state written to {}", path);
  } catch (const std::exception& e) {
    spdlog::error("stall detector: could not write the dump: {}", e.what());
  }
  notify(false, why);
  return false;
}

void StallDetector::on_state_change(std::function<void(bool, const std::string&)> fn) {
  listeners_.push_back(std::move(fn));
}

void StallDetector::notify(bool healthy, const std::string& reason) {
  for (auto& fn : listeners_) {
    try {
      fn(healthy, reason);
    } catch (const std::exception& e) {
      spdlog::error("stall detector: a state listener failed: {}", e.what());
    }
  }
}

std::string StallDetector::describe_components() {
  std::vector<std::pair<std::string, std::function<std::string()>>> comps;
  {
    std::lock_guard<std::mutex> l(components_mu_);
    comps = components_;
  }
  std::string out = fmt::format("== components ({}) ==\n", comps.size());
  for (auto& [name, fn] : comps) {
    // Run each describe() on its own thread so a component stuck on the stalled lock cannot
    // block the dump; if it never returns, that thread is left behind (it is stuck anyway).
    auto promise = std::make_shared<std::promise<std::string>>();
    auto fut = promise->get_future();
    std::thread([promise, fn = fn]() {
      try {
        promise->set_value(fn());
      } catch (const std::exception& e) {
        promise->set_value(fmt::format("(describe failed: {})", e.what()));
      } catch (...) {
        promise->set_value("(describe failed)");
      }
    }).detach();
    std::string text;
    if (fut.wait_for(config_.component_timeout) == std::future_status::ready)
      text = fut.get();
    else
      text = fmt::format("(no answer within {} ms: probably blocked on the stalled code)",
                         config_.component_timeout.count());
    if (!text.empty() && text.back() != '\n') text += '\n';
    out += fmt::format("[{}]\n{}", name, text);
  }
  return out;
}

std::string StallDetector::dump_now(const std::string& reason) {
  std::error_code ec;
  std::filesystem::create_directories(config_.dump_dir, ec);
  if (ec) fail("cannot create dump directory {}: {}", config_.dump_dir, ec.message());
  auto wall = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count() % 1000;
  std::time_t t = std::chrono::system_clock::to_time_t(wall);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::string stamp = fmt::format("{:%Y%m%dT%H%M%S}.{:03d}Z", tm, int(ms));
  std::string path = fmt::format("{}/stall-r{}-{}-{}.txt", config_.dump_dir, config_.rank, stamp, ::getpid());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write {}: {}", path, std::strerror(errno));
  std::string head = fmt::format("dsv41-serve diagnostic dump\ntime: {}\nrank: {}\npid: {}\nreason: {}\n\n", stamp,
                                 config_.rank, ::getpid(), reason);
  head += describe_components();
  head += "\n";
  bool ok = ::write(fd, head.data(), head.size()) == ssize_t(head.size());
  if (config_.thread_stacks) write_thread_dump(fd);
  ::close(fd);
  if (!ok) fail("short write to {}", path);
  dumps_.fetch_add(1);
  {
    std::lock_guard<std::mutex> l(status_mu_);
    last_dump_ = path;
  }
  return path;
}

void StallDetector::start() {
  DSV_CHECK(!thread_.joinable(), "stall detector: already started");
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { run_loop(); });
}

void StallDetector::stop() {
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    stopping_ = true;
  }
  loop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StallDetector::run_loop() {
  std::unique_lock<std::mutex> l(loop_mu_);
  while (!stopping_) {
    l.unlock();
    try {
      check_now();
    } catch (const std::exception& e) {
      spdlog::error("stall detector: check failed: {}", e.what());
    }
    l.lock();
    loop_cv_.wait_for(l, config_.period, [this] { return stopping_; });
  }
}

}  // namespace dsv41::runtime
