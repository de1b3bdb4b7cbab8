// Runs the dsv41-serve binary under test (DSV41_BINARY) with a shell argument string and
// collects its exit code and stdout (optionally stderr too). Shared by the CLI tests.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace dsv41::test {

struct CliResult {
  int exit_code = -1;
  std::string out;
};

enum class Stderr { kDiscard, kMerge };

inline CliResult run_cli(const std::string& args, Stderr err = Stderr::kDiscard) {
  const std::string cmd =
      std::string(DSV41_BINARY) + " " + args + (err == Stderr::kMerge ? " 2>&1" : " 2>/dev/null");
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace dsv41::test
