#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <thread>

#include "dsv41/common/error.h"
#include "dsv41/config/env_file.h"
#include "dsv41/runtime/health.h"
#include "dsv41/runtime/ops_options.h"
#include "dsv41/runtime/progress.h"

using namespace dsv41::runtime;

TEST(Progress, LogLinesOncePerTenPercentThenFinal) {
  std::vector<std::string> lines;
  {
    Progress p("loading weights", 100 * kGiB, true, Progress::Mode::log_lines,
               [&](const std::string& l, bool redraw) {
                 EXPECT_FALSE(redraw);
                 lines.push_back(l);
               });
    for (int i = 0; i < 100; ++i) p.advance(kGiB);
    EXPECT_EQ(p.done(), 100 * kGiB);
  }  // destructor finishes
  ASSERT_EQ(lines.size(), 10u) << "10 %, 20 %, ..., 90 % and the final line";
  for (int d = 1; d <= 9; ++d)
    EXPECT_EQ(lines[size_t(d - 1)].rfind(fmt::format("loading weights: {:3d}% ({}.0/100.0 GiB", d * 10, d * 10), 0), 0u)
        << lines[size_t(d - 1)];
  EXPECT_EQ(lines.back().rfind("loading weights: 100% (100.0/100.0 GiB", 0), 0u) << lines.back();
}

TEST(Progress, ConcurrentAdvancesGiveOneLinePerDecile) {
  std::vector<std::string> lines;
  std::mutex mu;
  {
    Progress p("loading weights", 1000, false, Progress::Mode::log_lines, [&](const std::string& l, bool) {
      std::lock_guard<std::mutex> g(mu);
      lines.push_back(l);
    });
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&] {
        for (int i = 0; i < 250; ++i) p.advance(1);
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(p.done(), 1000u);
  }
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_EQ(lines.back().rfind("loading weights: 100% (1000/1000", 0), 0u) << lines.back();
}

TEST(Progress, TerminalRedrawsABar) {
  std::vector<std::string> lines;
  Progress p("packing Engram", 4, false, Progress::Mode::terminal, [&](const std::string& l, bool redraw) {
    EXPECT_TRUE(redraw);
    lines.push_back(l);
  });
  p.advance(2);  // first draw is immediate
  p.advance(1);  // throttled (< 100 ms)
  p.finish();
  p.finish();  // once only
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("[###############...............]  50% packing Engram 2/4", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("[######################........]  75% packing Engram 3/4", 0), 0u) << lines[1];
  EXPECT_EQ(lines[1].back(), '\n');
}

TEST(StartupTimer, RecordsPhasesInOrder) {
  StartupTimer t;
  t.begin("config");
  t.begin("weights");
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  t.begin("graphs");
  t.finish();
  auto ph = t.phases();
  ASSERT_EQ(ph.size(), 3u);
  EXPECT_EQ(ph[0].first, "config");
  EXPECT_EQ(ph[1].first, "weights");
  EXPECT_GE(ph[1].second, 0.025);
  EXPECT_LT(ph[0].second, ph[1].second);
  EXPECT_NE(t.summary().find(": config "), std::string::npos) << t.summary();
}

TEST(OpsOptions, FlagsEnvFileAndDerivedConfigs) {
  CLI::App app("t");
  OpsOptions o;
  add_ops_options(app, o);
  app.parse(std::vector<std::string>{"2", "--stall-timeout-s"});  // reversed argv
  auto f = dsv41::config::parse_env_text("DSV41_MEMORY_MARGIN_GIB=8\nDSV41_LOG_DIR=/var/log/dsv41\n", "c.env");
  dsv41::config::apply_env_file(app, f);
  EXPECT_DOUBLE_EQ(o.memory_margin_gib, 8.0);
  EXPECT_DOUBLE_EQ(o.stall_timeout_s, 2.0);
  EXPECT_EQ(o.log_dir, "/var/log/dsv41");
  auto w = watchdog_config(o);
  EXPECT_EQ(w.margin_bytes, 8 * kGiB);
  EXPECT_EQ(w.hysteresis_bytes, 2 * kGiB);
  auto s = stall_config(o, 1);
  EXPECT_EQ(s.stall_after.count(), 2000);
  EXPECT_EQ(s.period.count(), 500);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.dump_dir, "/var/log/dsv41");
  CLI::App bad("t");
  OpsOptions b;
  add_ops_options(bad, b);
  EXPECT_THROW(bad.parse(std::vector<std::string>{"-1", "--memory-margin-gib"}), CLI::ValidationError);
}

TEST(RuntimeHealth, ReflectsWatchdogAndStall) {
  std::atomic<uint64_t> avail{16 * kGiB};
  MemoryWatchdog wd([&] { return MemoryReading{avail.load(), "fake"}; }, WatchdogConfig{});
  std::atomic<uint64_t> steps{0};
  StallConfig sc;
  sc.stall_after = std::chrono::milliseconds(20);
  sc.dump_dir = (std::filesystem::temp_directory_path() / fmt::format("dsv41_health_{}", ::getpid())).string();
  sc.thread_stacks = false;
  StallDetector st(sc, [] { return true; }, [&] { return steps.load(); });
  wd.check_now();
  st.check_now();
  auto h = runtime_health(&wd, &st);
  EXPECT_TRUE(h.healthy);
  EXPECT_TRUE(h.admitting);
  EXPECT_EQ(h.detail["memory"]["state"], "ok");
  EXPECT_EQ(h.detail["memory"]["available_bytes"], 16 * kGiB);
  EXPECT_EQ(h.detail["stall"]["state"], "ok");

  avail = kGiB;
  wd.check_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  st.check_now();
  h = runtime_health(&wd, &st);
  EXPECT_FALSE(h.healthy);
  EXPECT_FALSE(h.admitting);
  EXPECT_EQ(h.detail["memory"]["state"], "low");
  EXPECT_EQ(h.detail["memory"]["retry_after_s"], 5);
  EXPECT_EQ(h.detail["stall"]["state"], "stalled");
  EXPECT_TRUE(std::filesystem::exists(h.detail["stall"]["last_dump"].get<std::string>()));
  EXPECT_TRUE(runtime_health(nullptr, nullptr).healthy);
  std::filesystem::remove_all(sc.dump_dir);
}
