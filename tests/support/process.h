// Child processes for the multi-process tests (server, tensor-parallel ranks): a free TCP port, the
// dsv41-serve binary under test (DSV41_BINARY) started with its output in a log file, waiting for
// it to exit, and reading its log.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dsv41::test {

// A loopback port nothing listens on right now (bind port 0, read it back, release it).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts DSV41_BINARY with `args`; stderr goes to `log`, stdout to `out` when given, else to `log`
// as well. Returns the pid, or -1 when the process could not be started.
inline pid_t spawn_binary(std::vector<std::string> args, const std::filesystem::path& log,
                          const std::filesystem::path& out = {}) {
  args.insert(args.begin(), DSV41_BINARY);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out.empty()) posix_spawn_file_actions_adddup2(&fa, 2, 1);
  else posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Waits up to `timeout` for the process; returns its exit code (-1: killed by a signal, or still
// running at the timeout, then killed).
inline int wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  return -1;
}

// A file's whole text (a child's log), empty when it cannot be read.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace dsv41::test
