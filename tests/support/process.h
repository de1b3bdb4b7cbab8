// Child processes for the multi-process tests (server, tensor-parallel ranks): a free TCP port and
// the dsv41-serve binary under test (DSV41_BINARY) started with its output in a log file.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
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

}  // namespace dsv41::test
