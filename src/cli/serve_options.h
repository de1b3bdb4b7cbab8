// Options of the bare form (the server on rank 0, the headless worker on rank > 0).
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace dsv41::cli {

struct ServeOptions {
  int rank = 0;
  int world_size = 1;
  std::string model_dir;
  std::string engram_dir;
  std::string host = "127.0.0.1";
  int port = 8888;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string api_key;
  std::string config_file;
  std::string device = "auto";
  std::string engram_token_map;
  std::string log_level = "info";
  // Server and engine loop (rank 0)
  std::string tokenizer;                       // tokenizer.json when the checkpoint folder has none
  std::vector<std::string> served_model_names;  // default: the --model argument
  int64_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;                   // 0: the config's max_position_embeddings
  double kv_cache_gib = 4.0;
  int64_t max_waiting = 256;
  int http_threads = 128;
  int read_timeout_s = 10;
  bool no_dspark = false;
};

void add_serve_options(CLI::App& root, ServeOptions& o);
int run_serve(const ServeOptions& o);

}  // namespace dsv41::cli
