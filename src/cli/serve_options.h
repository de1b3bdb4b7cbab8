// Options of the bare form (the server on rank 0, the headless worker on rank > 0).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

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
};

void add_serve_options(CLI::App& root, ServeOptions& o);
int run_serve(const ServeOptions& o);

}  // namespace dsv41::cli
