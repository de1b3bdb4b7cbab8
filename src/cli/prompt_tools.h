// Pieces shared by the tools that run the engine on a prompt file (`logits`, `generate`): the
// prompt-ids file, the model-loading options (--model, --engram-*, --corrected-index-keys) and
// the --device check.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/model/cpu_model.h"

namespace dsv41::cli {

// A JSON file holding a non-empty array of token ids.
std::vector<int32_t> read_prompt_ids(const std::string& path);

struct ModelLoadArgs {
  std::string model_dir, engram_token_map, device = "cpu";
  std::string engram_dir, engram_packed;  // Engram row storage (docs/ENGRAM.md)
  double engram_cache_gib = 0.0;
  bool corrected_index_keys = false;
};

// --model (required), --engram-token-map, --engram-dir, --engram-packed, --engram-cache-gib,
// --device, --corrected-index-keys.
void add_model_load_options(CLI::App* app, ModelLoadArgs& a);
// One clear error unless --device is cpu (`tool` names the command in the message).
void require_cpu_device(const ModelLoadArgs& a, const std::string& tool);
model::CpuModelOptions cpu_model_options(const ModelLoadArgs& a);
// Every prompt id inside the model's vocabulary (the error names the file and the index).
void check_prompt_ids(const std::vector<int32_t>& prompt, int64_t vocab, const std::string& path);

}  // namespace dsv41::cli
