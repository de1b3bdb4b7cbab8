// The seeds' failure mode: memory falls steadily while requests keep coming. The watchdog must
// stop admission, run relief actions in order, re-admit after recovery, and never crash.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "dsv41/runtime/watchdog.h"

using namespace dsv41::runtime;
using namespace std::chrono_literals;

namespace {

// Injectable MemAvailable that the test (and the fake relief actions) move.
struct FakeMemory {
  std::atomic<int64_t> available{int64_t(20 * kGiB)};
  std::atomic<bool> broken{false};
  MemorySource source() {
    return [this] {
      if (broken.load()) throw std::runtime_error("meminfo unreadable");
      return MemoryReading{uint64_t(available.load()), "fake MemAvailable"};
    };
  }
};

WatchdogConfig cfg(std::chrono::milliseconds period = 500ms) {
  WatchdogConfig c;
  c.margin_bytes = 4 * kGiB;
  c.hysteresis_bytes = 1 * kGiB;
  c.period = period;
  c.retry_after_s = 7;
  return c;
}

}  // namespace

TEST(Watchdog, FallingMemoryStopsAdmissionThenRecoveryReadmits) {
  FakeMemory mem;
  MemoryWatchdog wd(mem.source(), cfg());
  std::vector<MemoryState> transitions;
  wd.on_state_change([&](MemoryState s) { transitions.push_back(s); });

  // A fake front door: admits while the watchdog says so, otherwise answers 503 + Retry-After.
  int admitted = 0, rejected = 0, last_retry_after = 0;
  auto request = [&] {
    auto a = wd.admission();
    if (a.admit) {
      ++admitted;
    } else {
      ++rejected;
      last_retry_after = a.retry_after_s;
      EXPECT_NE(a.reason.find("below the margin"), std::string::npos) << a.reason;
    }
  };

  // 20 GiB falling by 1 GiB per sample down to 1 GiB.
  int first_rejected_at = -1;
  for (int gib = 20; gib >= 1; --gib) {
    mem.available = int64_t(gib) * int64_t(kGiB);
    wd.check_now();
    int before = rejected;
    request();
    if (rejected > before && first_rejected_at < 0) first_rejected_at = gib;
  }
  EXPECT_EQ(first_rejected_at, 3) << "admission must stop as soon as available < 4 GiB margin";
  EXPECT_EQ(admitted, 17);  // 20..4 GiB
  EXPECT_EQ(rejected, 3);   // 3, 2, 1 GiB
  EXPECT_EQ(last_retry_after, 7);
  EXPECT_EQ(wd.state(), MemoryState::low);

  // Hysteresis: back at 4.5 GiB (above the margin, below margin + hysteresis) still rejects.
  mem.available = int64_t(4 * kGiB + kGiB / 2);
  wd.check_now();
  EXPECT_FALSE(wd.admitting());
  // 5 GiB = margin + hysteresis: admitting again.
  mem.available = int64_t(5 * kGiB);
  wd.check_now();
  EXPECT_TRUE(wd.admitting());
  request();
  EXPECT_EQ(admitted, 18);
  ASSERT_EQ(transitions.size(), 2u);
  EXPECT_EQ(transitions[0], MemoryState::low);
  EXPECT_EQ(transitions[1], MemoryState::ok);
  EXPECT_EQ(wd.low_episodes(), 1u);
}

TEST(Watchdog, ActionsRunInOrderAndStopOnceMemoryIsBack) {
  FakeMemory mem;
  MemoryWatchdog wd(mem.source(), cfg());
  std::vector<std::string> log;
  int cache_gib = 1;    // the cache can give back 1 GiB once
  int sequences = 3;    // each preempted sequence frees 2 GiB
  wd.add_action("shrink caches", [&](const LowMemory& m) {
    EXPECT_GT(m.deficit_bytes, 0u);
    EXPECT_EQ(m.margin_bytes, 4 * kGiB);
    if (cache_gib == 0) return ActionResult{false, ""};
    log.push_back("shrink");
    mem.available += int64_t(cache_gib) * int64_t(kGiB);
    cache_gib = 0;
    return ActionResult{true, "freed 1 GiB of Engram cache"};
  });
  wd.add_action("preempt youngest sequence", [&](const LowMemory&) {
    if (sequences == 0) return ActionResult{false, ""};
    log.push_back("preempt");
    --sequences;
    mem.available += int64_t(2 * kGiB);
    return ActionResult{true, "preempted the youngest sequence"};
  });

  // 2 GiB available: shrink (-> 3 GiB, still low), then preempt (-> 5 GiB): done.
  mem.available = int64_t(2 * kGiB);
  EXPECT_EQ(wd.check_now(), MemoryState::low);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0], "shrink");
  EXPECT_EQ(log[1], "preempt");
  EXPECT_EQ(sequences, 2);
  EXPECT_FALSE(wd.admitting()) << "admission stays off until the next sample confirms recovery";

  // Memory is fine now but only 5 GiB: still within hysteresis? 5 = margin + hysteresis -> ok.
  EXPECT_EQ(wd.check_now(), MemoryState::ok);
  EXPECT_TRUE(wd.admitting());

  // Memory falls again to 3.5 GiB: the cache is empty, so the first action reports nothing to do and
  // exactly one more sequence is preempted (3.5 + 2 = 5.5 >= 4 stops the escalation).
  log.clear();
  mem.available = int64_t(3 * kGiB + kGiB / 2);
  wd.check_now();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], "preempt");
  EXPECT_EQ(sequences, 1);
}

TEST(Watchdog, FailingSourceOrActionDoesNotCrash) {
  FakeMemory mem;
  MemoryWatchdog wd(mem.source(), cfg());
  wd.add_action("throws", [](const LowMemory&) -> ActionResult { throw std::runtime_error("boom"); });
  int second = 0;
  wd.add_action("second", [&](const LowMemory&) {
    ++second;
    return ActionResult{true, "ran"};
  });
  mem.available = int64_t(kGiB);
  EXPECT_EQ(wd.check_now(), MemoryState::low);
  EXPECT_EQ(second, 1) << "an action that throws must not stop the next one";
  mem.broken = true;
  EXPECT_EQ(wd.check_now(), MemoryState::low) << "unreadable source keeps the last state";
  EXPECT_EQ(wd.source_errors(), 1u);
  mem.broken = false;
  mem.available = int64_t(10 * kGiB);
  EXPECT_EQ(wd.check_now(), MemoryState::ok);
}

TEST(Watchdog, BackgroundThreadReactsAndStopsCleanly) {
  FakeMemory mem;
  auto wd = std::make_unique<MemoryWatchdog>(mem.source(), cfg(2ms));
  std::atomic<int> preempts{0};
  wd->add_action("preempt", [&](const LowMemory&) {
    preempts.fetch_add(1);
    return ActionResult{true, "preempted"};
  });
  wd->start();
  // A request stream on another thread while memory collapses underneath it.
  std::atomic<bool> stop{false};
  std::atomic<int> rejected{0};
  std::thread clients([&] {
    while (!stop.load()) {
      if (!wd->admission().admit) rejected.fetch_add(1);
      std::this_thread::sleep_for(100us);
    }
  });
  for (int64_t gib = 10; gib >= 0; --gib) {
    mem.available = gib * int64_t(kGiB);
    std::this_thread::sleep_for(5ms);
  }
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (wd->admitting() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(wd->admitting());
  EXPECT_GT(preempts.load(), 0);
  mem.available = int64_t(64 * kGiB);
  deadline = std::chrono::steady_clock::now() + 2s;
  while (!wd->admitting() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(wd->admitting());
  stop = true;
  clients.join();
  EXPECT_GT(rejected.load(), 0);
  EXPECT_GT(wd->samples(), 10u);
  wd->stop();
  wd->stop();  // idempotent
  wd.reset();
}

TEST(Watchdog, RealMeminfoParserOnAFallingFile) {
  // The production source (meminfo_source) reading a /proc/meminfo-format file that the test
  // rewrites: the same path the server uses, with the numbers under test control.
  auto path = std::filesystem::temp_directory_path() / fmt::format("dsv41_meminfo_wd_{}", ::getpid());
  auto write = [&](uint64_t kib) {
    std::ofstream(path) << fmt::format("MemTotal:       131072000 kB\nMemFree:          100000 kB\nMemAvailable: {:>12} kB\n",
                                       kib);
  };
  write(8 * 1024 * 1024);  // 8 GiB
  MemoryWatchdog wd(meminfo_source(path.string()), cfg());
  EXPECT_EQ(wd.check_now(), MemoryState::ok);
  EXPECT_EQ(wd.last_available_bytes(), 8 * kGiB);
  write(3 * 1024 * 1024);
  EXPECT_EQ(wd.check_now(), MemoryState::low);
  EXPECT_FALSE(wd.admission().admit);
  EXPECT_NE(wd.admission().reason.find(path.string()), std::string::npos) << wd.admission().reason;
  std::ofstream(path) << "garbage\n";  // unreadable: keeps the last state, no crash
  EXPECT_EQ(wd.check_now(), MemoryState::low);
  write(6 * 1024 * 1024);
  EXPECT_EQ(wd.check_now(), MemoryState::ok);
  std::filesystem::remove(path);
}
