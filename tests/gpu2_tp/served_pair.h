// The one-GPU server (TP 1, --device cuda) and the two-GPU server (rank 0 on GPU 0 with a rank-1
// worker on GPU 1, NCCL) on tiny-s0 with the byte-level test vocabulary, started together once per
// test process, on first use, and killed at exit: start-up costs seconds, and every check compares
// the TP 2 server's answer with the TP 1 server's.
#pragma once
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "../serve/test_tokenizer.h"
#include "../support/openai_answers.h"
#include "../support/tp_server.h"

namespace dsv41::test {

class ServedPair {
 public:
  // The TP 2 server wants this bearer token (every route but /health).
  static constexpr const char* kApiKey = "tp2-secret";
  // Seconds the TP 2 server waits for a stalled client's request (slow-loris check).
  static constexpr int kReadTimeoutS = 2;

  static ServedPair& get() {
    static ServedPair pair;
    return pair;
  }

  bool up() const { return up_; }
  // The logs of all three processes, for failure messages.
  std::string logs() const {
    return "--- server_tp1.log\n" + slurp(dir_ / "server_tp1.log") + "--- server_tp2.log\n" +
           slurp(dir_ / "server_tp2.log") + "--- worker.log\n" + slurp(dir_ / "worker.log");
  }
  std::string worker_log() const { return slurp(dir_ / "worker.log"); }

  ServerEndpoint one, two;

  // Kills the rank-1 worker (the TP 2 server stays up and must fail requests cleanly); from then
  // on the pair no longer counts as up for the tests that compare answers.
  void kill_worker() {
    kill_and_reap(worker_);
    worker_ = -1;
    up_ = false;
  }
  // SIGTERM to the TP 2 server; true when it exited with status 0.
  bool stop_two() {
    if (two_pid_ <= 0) return false;
    ::kill(two_pid_, SIGTERM);
    int st = 0;
    ::waitpid(two_pid_, &st, 0);
    two_pid_ = -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }

  ~ServedPair() {
    kill_and_reap(worker_);
    kill_and_reap(two_pid_);
    kill_and_reap(one_pid_);
  }

 private:
  ServedPair() : dir_(test_temp_dir("dsv41_cuda_tpserve_")) {
    const std::string tok = (dir_ / "tokenizer.json").string();
    test_support::write_test_tokenizer(tok);
    const std::vector<std::string> cuda = {"--device", "cuda"};
    std::vector<std::string> two_flags = cuda;
    two_flags.insert(two_flags.end(), {"--api-key", kApiKey, "--read-timeout", std::to_string(kReadTimeoutS)});
    // All three start at once (TP 1 shares GPU 0 with rank 0; the tiny model needs little memory).
    const TpServer s1 = start_tp_server(dir_, tok, 1, "tp1", cuda);
    const TpServer s2 = start_tp_server(dir_, tok, 2, "tp2", two_flags);
    worker_ = start_tp_worker(dir_, s2.master_port, "worker.log", cuda);
    one_pid_ = s1.pid;
    two_pid_ = s2.pid;
    one.port = s1.port;
    two.port = s2.port;
    two.auth = {{"Authorization", std::string("Bearer ") + kApiKey}};
    using namespace std::chrono_literals;
    up_ = one_pid_ > 0 && two_pid_ > 0 && worker_ > 0 && wait_healthy(one.port, 120s) && wait_healthy(two.port, 120s);
  }

  tp_server_fs::path dir_;
  pid_t one_pid_ = -1, two_pid_ = -1, worker_ = -1;
  bool up_ = false;
};

}  // namespace dsv41::test
