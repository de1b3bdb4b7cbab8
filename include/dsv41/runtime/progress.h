// Start-up feedback: a progress indicator for long byte-counted work (loading weights, packing
// Engram) and a timer that logs how long each start-up phase took.
//
//   Progress p("loading weights", total_bytes);      // thread-safe advance() from loader threads
//   p.advance(n); ... p.finish();
//   StartupTimer t; t.begin("config"); ...; t.begin("weights"); ...; t.finish();  // logs a summary
//
// On a terminal (stderr is a TTY) Progress redraws one line ("\r[#####.....]  45% ...") at most
// every 100 ms; otherwise (journal, log files) it logs one line per 10 %.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dsv41::runtime {

class Progress {
 public:
  enum class Mode { automatic, terminal, log_lines };
  using Sink = std::function<void(const std::string& line, bool redraw)>;

  // `unit_bytes`: totals are bytes (shown in GiB and GiB/s); otherwise plain counts of `unit`.
  Progress(std::string what, uint64_t total, bool unit_bytes = true, Mode mode = Mode::automatic, Sink sink = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t n);
  void finish();  // prints the final line (100 % or where it stopped) with the elapsed time
  uint64_t done() const { return done_.load(); }

 private:
  std::string line(uint64_t done, bool final) const;
  void emit(uint64_t done, bool final);

  std::string what_;
  uint64_t total_;
  bool bytes_;
  bool terminal_;
  Sink sink_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  int last_decile_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
  bool finished_ = false;
};

class StartupTimer {
 public:
  StartupTimer();
  // Ends the running phase (logging its duration) and starts `phase`.
  void begin(std::string phase);
  // Ends the running phase and logs "start-up took X s: a 1.2 s, b 3.4 s, ...".
  void finish();
  std::vector<std::pair<std::string, double>> phases() const;  // seconds, in order
  std::string summary() const;

 private:
  void end_current(std::chrono::steady_clock::time_point now);
  std::chrono::steady_clock::time_point start_, phase_start_;
  std::string current_;
  std::vector<std::pair<std::string, double>> phases_;
};

}  // namespace dsv41::runtime
