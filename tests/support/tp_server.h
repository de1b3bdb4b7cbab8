// The server on rank 0 with tensor-parallel workers as child processes, on the tiny-s0 fixture: the
// shared pieces of the CPU (tests/dist) and two-GPU (tests/gpu2_tp) server tests — a per-test
// temporary folder, starting and killing the processes, reading their logs, waiting for /health,
// and the greedy requests both compare.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../serve/http_client.h"
#include "process.h"

namespace dsv41::test {

namespace tp_server_fs = std::filesystem;

inline const std::string kTinyModel = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model";
inline const std::string kTinyMap = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/engram_token_map.safetensors";

// A folder for this test process's logs: <tmp>/<prefix><pid>.
inline tp_server_fs::path test_temp_dir(const std::string& prefix) {
  auto d = tp_server_fs::temp_directory_path() / (prefix + std::to_string(::getpid()));
  tp_server_fs::create_directories(d);
  return d;
}

inline void kill_and_reap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Polls /health until 200 (the port answers 503 while loading / waiting for workers).
inline bool wait_healthy(int port, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (test_support::http_request(port, "GET", "/health", {}, {}, 2000).status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// A greedy completion of `prompt` that returns its token ids.
inline nlohmann::ordered_json tiny_completion(const std::vector<int32_t>& prompt, int max_tokens) {
  return nlohmann::ordered_json{{"model", "tiny-s0"},  {"prompt", prompt},   {"max_tokens", max_tokens},
                                {"temperature", 0},    {"ignore_eos", true}, {"return_token_ids", true}};
}

inline nlohmann::ordered_json tiny_chat() {
  using J = nlohmann::ordered_json;
  return J{{"model", "tiny-s0"},
           {"messages", J::array({J{{"role", "user"}, {"content", "hello there"}}})},
           {"max_tokens", 8},
           {"temperature", 0}};
}

struct TpServer {
  int port = 0, master_port = 0;
  pid_t pid = -1;
};

// The server (rank 0) of `world` ranks on tiny-s0; its log is <dir>/server_<tag>.log. `extra` is
// appended to the command line (e.g. --device cuda).
inline TpServer start_tp_server(const tp_server_fs::path& dir, const std::string& tokenizer, int world,
                                const std::string& tag, const std::vector<std::string>& extra = {}) {
  TpServer s;
  s.port = free_port();
  s.master_port = free_port();
  std::vector<std::string> args = {"--model", kTinyModel, "--tokenizer", tokenizer, "--engram-token-map", kTinyMap,
                                   "--port", std::to_string(s.port), "--kv-cache-gib", "0.01", "--served-model-name",
                                   "tiny-s0", "--world-size", std::to_string(world), "--master-port",
                                   std::to_string(s.master_port)};
  args.insert(args.end(), extra.begin(), extra.end());
  s.pid = spawn_binary(args, dir / ("server_" + tag + ".log"));
  return s;
}

// Worker rank 1 of 2 joining the server at master_port; its log is <dir>/<log_name>.
inline pid_t start_tp_worker(const tp_server_fs::path& dir, int master_port, const std::string& log_name,
                             const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--rank", "1", "--world-size", "2", "--model", kTinyModel, "--master-addr",
                                   "127.0.0.1", "--master-port", std::to_string(master_port), "--engram-token-map",
                                   kTinyMap};
  args.insert(args.end(), extra.begin(), extra.end());
  return spawn_binary(args, dir / log_name);
}

}  // namespace dsv41::test
