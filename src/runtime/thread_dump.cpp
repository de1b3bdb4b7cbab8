#include "dsv41/runtime/thread_dump.h"

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace dsv41::runtime {
namespace {

constexpr int kMaxFrames = 64;

std::mutex g_dump_mu;                 // one dump at a time
std::atomic<long> g_target_tid{0};    // the thread that should answer the signal
std::atomic<long> g_answered_tid{0};  // set by the handler when done
std::atomic<int> g_fd{-1};
std::atomic<int> g_installed{0};      // 0 = not tried, 1 = ours, -1 = signal owned by someone else
std::mutex g_install_mu;

long current_tid() { return long(::syscall(SYS_gettid)); }

// Async-signal context: only backtrace (libgcc preloaded at install), write and atomics.
void dump_handler(int, siginfo_t*, void*) {
  int saved_errno = errno;
  long tid = current_tid();
  if (g_target_tid.load() == tid) {
    void* frames[kMaxFrames];
    int n = ::backtrace(frames, kMaxFrames);
    int fd = g_fd.load();
    if (fd >= 0) ::backtrace_symbols_fd(frames, n, fd);
    g_answered_tid.store(tid);
  }
  errno = saved_errno;
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The state letter of /proc/<pid>/task/<tid>/stat: field 3, after the ")" that closes comm.
std::string thread_state(const std::string& stat) {
  size_t p = stat.rfind(')');
  if (p == std::string::npos || p + 2 >= stat.size()) return "?";
  char c = stat[p + 2];
  const char* word = "unknown";
  switch (c) {
    case 'R': word = "running"; break;
    case 'S': word = "sleeping"; break;
    case 'D': word = "uninterruptible wait"; break;
    case 'T': word = "stopped"; break;
    case 't': word = "tracing stop"; break;
    case 'Z': word = "zombie"; break;
    case 'X': word = "dead"; break;
    case 'I': word = "idle"; break;
  }
  return fmt::format("{} ({})", c, word);
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    off += size_t(n);
  }
}

std::vector<long> list_threads() {
  std::vector<long> tids;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return tids;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long t = std::strtol(e->d_name, &end, 10);
    if (end && *end == '\0' && t > 0) tids.push_back(t);
  }
  ::closedir(d);
  std::sort(tids.begin(), tids.end());
  return tids;
}

}  // namespace

int thread_dump_signal() { return SIGRTMIN + 5; }

bool install_thread_dump_handler() {
  std::lock_guard<std::mutex> l(g_install_mu);
  if (g_installed.load() != 0) return g_installed.load() == 1;
  // backtrace() loads libgcc_s lazily on first use, which allocates: do it now, outside any handler.
  void* warm[2];
  ::backtrace(warm, 2);
  struct sigaction old {};
  ::sigaction(thread_dump_signal(), nullptr, &old);
  bool foreign = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                              : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
  if (foreign) {
    g_installed.store(-1);
    return false;
  }
  struct sigaction sa {};
  sa.sa_sigaction = dump_handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(thread_dump_signal(), &sa, nullptr) != 0) {
    g_installed.store(-1);
    return false;
  }
  g_installed.store(1);
  return true;
}

int write_thread_dump(int fd, std::chrono::milliseconds per_thread_timeout) {
  std::lock_guard<std::mutex> l(g_dump_mu);
  bool stacks = install_thread_dump_handler();
  const long self = current_tid();
  const pid_t pid = ::getpid();
  auto tids = list_threads();
  write_all(fd, fmt::format("== threads ({}) of pid {} ==\n", tids.size(), pid));
  if (!stacks)
    write_all(fd, fmt::format("(signal {} is owned by another handler: no stacks, states only)\n",
                              thread_dump_signal()));
  g_fd.store(fd);
  for (long tid : tids) {
    std::string base = fmt::format("/proc/self/task/{}/", tid);
    std::string comm = read_small_file(base + "comm");
    std::string stat = read_small_file(base + "stat");
    std::string wchan = read_small_file(base + "wchan");
    if (wchan.empty() || wchan == "0") wchan = "-";
    std::string header = fmt::format("--- thread {} \"{}\" state {} wchan {}", tid, comm,
                                     stat.empty() ? std::string("?") : thread_state(stat), wchan);
    if (tid == self) header += " (dumping thread)";
    header += " ---\n";
    write_all(fd, header);
    if (!stacks) continue;
    if (tid == self) {
      void* frames[kMaxFrames];
      int n = ::backtrace(frames, kMaxFrames);
      ::backtrace_symbols_fd(frames, n, fd);
      continue;
    }
    g_answered_tid.store(0);
    g_target_tid.store(tid);
    if (::syscall(SYS_tgkill, pid, tid, thread_dump_signal()) != 0) {
      write_all(fd, "(thread exited before it could be signalled)\n");
      g_target_tid.store(0);
      continue;
    }
    auto deadline = std::chrono::steady_clock::now() + per_thread_timeout;
    while (g_answered_tid.load() != tid && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    bool answered = g_answered_tid.load() == tid;
    g_target_tid.store(0);
    if (!answered)
      write_all(fd, fmt::format("(no answer within {} ms: signal blocked or uninterruptible wait)\n",
                                per_thread_timeout.count()));
  }
  g_fd.store(-1);
  return int(tids.size());
}

}  // namespace dsv41::runtime
