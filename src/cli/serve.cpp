// The bare form: `dsv41-serve --rank 0 --model DIR ...` (server) or `--rank 1 ...` (worker).
#include <spdlog/spdlog.h>

#include "cli/serve_options.h"
#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"

namespace dsv41::cli {

void add_serve_options(CLI::App& app, ServeOptions& o) {
  app.add_option("--rank", o.rank, "This process's rank: 0 = head (HTTP server), >0 = headless worker")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world-size", o.world_size, "Number of tensor-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--model", o.model_dir, "Checkpoint folder (config.json + *.safetensors)");
  app.add_option("--engram-dir", o.engram_dir, "Folder with the original checkpoint's Engram shards");
  app.add_option("--host", o.host, "HTTP bind address")->capture_default_str();
  app.add_option("--port", o.port, "HTTP port")->capture_default_str()->check(CLI::Range(1, 65535));
  app.add_option("--master-addr", o.master_addr, "Address of rank 0's control endpoint")->capture_default_str();
  app.add_option("--master-port", o.master_port, "Port of rank 0's control endpoint")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app.add_option("--api-key", o.api_key, "Require this bearer token (also DSV41_API_KEY)");
  app.add_option("--config", o.config_file, "Configuration file (KEY=VALUE lines); flags override it");
  app.add_option("--device", o.device, "cpu, cuda or auto")->capture_default_str();
  app.add_option("--engram-token-map", o.engram_token_map, "safetensors file with an int32 token_map");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")->capture_default_str();
}

int run_serve(const ServeOptions& o) {
  if (o.model_dir.empty()) fail("--model DIR is required (see --help)");
  if (o.rank >= o.world_size) fail("--rank {} must be below --world-size {}", o.rank, o.world_size);
  spdlog::info("loading checkpoint {}", o.model_dir);
  ModelConfig cfg = load_model_config(o.model_dir + "/config.json");
  auto problems = validate_config(cfg);
  if (!problems.empty()) fail("{}/config.json: {} (and {} more)", o.model_dir, problems.front(), problems.size() - 1);
  auto ckpt = Checkpoint::open(o.model_dir);
  spdlog::info("checkpoint {} opened: {} tensors, {} bytes", o.model_dir, ckpt->tensors().size(), ckpt->total_bytes());
  fail("the checkpoint is valid, but serving is not built yet in this version (use `dsv41-serve inspect`)");
}

}  // namespace dsv41::cli
