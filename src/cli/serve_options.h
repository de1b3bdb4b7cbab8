// Options of the bare form (the server on rank 0, the headless worker on rank > 0).
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dsv41/runtime/ops_options.h"

namespace dsv41 {
class Checkpoint;
}

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
  std::string engram_packed;      // --engram-packed: pack-engram output (wins over --engram-dir)
  double engram_cache_gib = 0.0;  // --engram-cache-gib: Engram row cache
  runtime::OpsOptions ops;        // --memory-margin-gib, --stall-timeout-s, --log-dir
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
  // Speculative decoding (docs/SPECULATIVE.md)
  std::string spec_method = "none";            // dspark | none
  int64_t spec_tokens = 0;                     // drafts per step at most; 0 = the drafter's block size
  bool spec_fixed_tokens = false;              // always spec_tokens drafts (no adaptive length)
  int64_t spec_disable_batch_size = 4;         // no speculation when more sequences decode at once; 0 = never
};

void add_serve_options(CLI::App& root, ServeOptions& o);
int run_serve(const ServeOptions& o);

// Start-up of a rank before the engine loads (src/cli/serve.cpp): opens the checkpoint's headers,
// prints this rank's memory budget table and refuses to start (dsv41::Error with the table) when
// --memory-margin-gib is not met, then reads the weights in with a progress indicator. The
// returned checkpoint may serve the Engram tables kept in place; it must outlive their store.
std::unique_ptr<Checkpoint> check_memory_and_preload(const ServeOptions& o);

}  // namespace dsv41::cli
