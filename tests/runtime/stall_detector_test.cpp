// A deliberately stalled fake step: a "step" thread makes progress, then blocks on a lock while
// work is pending. The detector must flip health, write one dump with the components' states and
// every thread's stack, and turn healthy again when the step resumes.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "dsv41/runtime/stall_detector.h"
#include "dsv41/runtime/thread_dump.h"

using namespace dsv41::runtime;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("dsv41_{}_{}", name, ::getpid());
  fs::remove_all(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fake engine: runs steps (progress++) while `pending`; blocks inside a step while `stall`.
struct FakeEngine {
  std::atomic<uint64_t> steps{0};
  std::atomic<bool> pending{true};
  std::mutex step_mu;  // held by the step; the engine's describe() needs it too
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool stall = false, quit = false;
  std::thread th;

  void start() {
    th = std::thread([this] {
      pthread_setname_np(pthread_self(), "fake-step");
      while (true) {
        std::lock_guard<std::mutex> step(step_mu);
        std::unique_lock<std::mutex> g(gate_mu);
        gate_cv.wait(g, [this] { return !stall || quit; });  // the stall: blocked inside a step
        if (quit) return;
        g.unlock();
        steps.fetch_add(1);
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  void set_stall(bool s) {
    {
      std::lock_guard<std::mutex> g(gate_mu);
      stall = s;
    }
    gate_cv.notify_all();
  }
  void finish() {
    {
      std::lock_guard<std::mutex> g(gate_mu);
      quit = true;
    }
    gate_cv.notify_all();
    if (th.joinable()) th.join();
  }
};

template <class F>
bool wait_until(F cond, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

}  // namespace

TEST(StallDetector, StalledStepFlipsHealthAndDumpsThreads) {
  fs::path dir = fresh_dir("stall");
  FakeEngine eng;
  StallConfig c;
  c.stall_after = 400ms;  // generous: CI machines are small and busy
  c.period = 10ms;
  c.dump_dir = dir.string();
  c.rank = 1;
  c.component_timeout = 300ms;
  StallDetector det(c, [&] { return eng.pending.load(); }, [&] { return eng.steps.load(); });
  det.add_component("scheduler", [] { return std::string("running=2 waiting=5\nyoungest=seq-17"); });
  // Needs the lock the stalled step holds: must be reported as not answering, not hang the dump.
  std::atomic<int> engine_described{0};
  det.add_component("engine", [&] {
    std::lock_guard<std::mutex> l(eng.step_mu);
    engine_described.fetch_add(1);
    return fmt::format("steps={}", eng.steps.load());
  });
  eng.start();
  det.start();

  ASSERT_TRUE(wait_until([&] { return eng.steps.load() > 20; }, 2s));
  std::this_thread::sleep_for(700ms);  // longer than stall_after, but progressing: healthy
  EXPECT_TRUE(det.healthy());
  EXPECT_EQ(det.dumps(), 0u);

  eng.set_stall(true);
  ASSERT_TRUE(wait_until([&] { return !det.healthy(); }, 3s)) << "stall not detected";
  EXPECT_NE(det.health_reason().find("no step progress"), std::string::npos) << det.health_reason();
  ASSERT_TRUE(wait_until([&] { return det.dumps() == 1; }, 3s));
  std::string path = det.last_dump_path();
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_TRUE(std::regex_search(fs::path(path).filename().string(), std::regex(R"(^stall-r1-\d{8}T\d{6}\.\d{3}Z-\d+\.txt$)")))
      << path;

  std::string dump = slurp(path);
  EXPECT_NE(dump.find("rank: 1"), std::string::npos);
  EXPECT_NE(dump.find("reason: no step progress"), std::string::npos);
  EXPECT_NE(dump.find("[scheduler]\nrunning=2 waiting=5\nyoungest=seq-17\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("[engine]\n(no answer within 300 ms"), std::string::npos) << dump;
  // The stalled thread is listed by name, sleeping, with a stack of at least a few frames.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dump, m, std::regex(R"(--- thread (\d+) "fake-step" state S \(sleeping\)[^\n]*---\n)")))
      << dump;
  std::string after = m.suffix().str();
  std::string section = after.substr(0, after.find("--- thread"));
  int frames = 0;
  for (size_t p = section.find("[0x"); p != std::string::npos; p = section.find("[0x", p + 1)) ++frames;
  EXPECT_GE(frames, 3) << section;
  // The detector's own thread appears as the dumping thread.
  EXPECT_NE(dump.find("(dumping thread)"), std::string::npos);

  // Still stalled: no second dump for the same episode.
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(det.dumps(), 1u);

  eng.set_stall(false);
  ASSERT_TRUE(wait_until([&] { return det.healthy(); }, 3s)) << "did not recover after progress resumed";
  EXPECT_TRUE(det.health_reason().empty());

  det.stop();
  // The describe() left waiting on the stalled lock finishes once the step moved on; wait for it
  // before `eng` goes out of scope.
  EXPECT_TRUE(wait_until([&] { return engine_described.load() >= 1; }, 3s));
  eng.finish();
  fs::remove_all(dir);
}

TEST(StallDetector, IdleIsNotAStall) {
  fs::path dir = fresh_dir("idle");
  std::atomic<bool> pending{false};
  std::atomic<uint64_t> steps{5};
  StallConfig c;
  c.stall_after = 300ms;
  c.period = 5ms;
  c.dump_dir = dir.string();
  StallDetector det(c, [&] { return pending.load(); }, [&] { return steps.load(); });
  for (int i = 0; i < 40; ++i) {  // 400 ms idle, no progress
    EXPECT_TRUE(det.check_now());
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(det.dumps(), 0u);
  EXPECT_FALSE(fs::exists(dir));
  // Work arrives and nothing moves: unhealthy after stall_after (checked synchronously).
  pending = true;
  EXPECT_TRUE(det.check_now());
  std::this_thread::sleep_for(350ms);
  EXPECT_FALSE(det.check_now());
  EXPECT_EQ(det.dumps(), 1u);
  // The queue drains without a step (e.g. requests cancelled): healthy again.
  pending = false;
  EXPECT_TRUE(det.check_now());
  fs::remove_all(dir);
}

TEST(ThreadDump, ListsEveryThreadWithAStack) {
  std::atomic<bool> quit{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&, i] {
      pthread_setname_np(pthread_self(), fmt::format("dump-probe-{}", i).c_str());
      while (!quit.load()) std::this_thread::sleep_for(1ms);
    });
  std::this_thread::sleep_for(20ms);
  fs::path p = fs::temp_directory_path() / fmt::format("dsv41_threads_{}.txt", ::getpid());
  FILE* f = std::fopen(p.c_str(), "w");
  ASSERT_NE(f, nullptr);
  int n = write_thread_dump(fileno(f));
  std::fclose(f);
  quit = true;
  for (auto& t : ts) t.join();
  std::string dump = slurp(p);
  fs::remove(p);
  EXPECT_GE(n, 4);
  for (int i = 0; i < 3; ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(dump, m, std::regex(fmt::format("\"dump-probe-{}\"[^\\n]*\\n([^\\n]*\\[0x)", i))))
        << dump;
  }
  EXPECT_EQ(dump.find("no answer"), std::string::npos) << dump;
}
