#include "cli/prompt_tools.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dsv41/common/error.h"

namespace dsv41::cli {

std::vector<int32_t> read_prompt_ids(const std::string& path) {
  std::ifstream f(path);
  DSV_CHECK(f.good(), "cannot read prompt ids file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  DSV_CHECK(j.is_array() && !j.empty(), "{}: expected a non-empty JSON array of token ids", path);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    DSV_CHECK(v.is_number_integer(), "{}: every entry must be an integer token id", path);
    const int64_t x = v.get<int64_t>();
    DSV_CHECK(x >= 0 && x <= INT32_MAX, "{}: token id {} is out of range", path, x);
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

void add_model_load_options(CLI::App* app, ModelLoadArgs& a) {
  app->add_option("--model", a.model_dir, "Checkpoint folder")->required();
  app->add_option("--engram-token-map", a.engram_token_map, "safetensors file with an int32 token_map");
  app->add_option("--engram-dir", a.engram_dir, "Folder with the index and the shards holding the Engram tables");
  app->add_option("--engram-packed", a.engram_packed, "Folder with Engram rows packed by pack-engram");
  app->add_option("--engram-cache-gib", a.engram_cache_gib, "Engram row cache size in GiB");
  app->add_option("--device", a.device, "Device: cpu or cuda")->capture_default_str();
  app->add_flag("--corrected-index-keys", a.corrected_index_keys,
                "Decode indexers score their own KV source's keys (default: the reference's decode alias)");
}

void require_cpu_device(const ModelLoadArgs& a, const std::string& tool) {
  if (a.device == "cpu") return;
  if (a.device == "cuda")
    fail("--device cuda: {} has no CUDA backend in this version; run it with --device cpu", tool);
  fail("--device {}: expected cpu or cuda", a.device);
}

model::CpuModelOptions cpu_model_options(const ModelLoadArgs& a) {
  model::CpuModelOptions mo;
  mo.engram_token_map = a.engram_token_map;
  mo.engram_storage.engram_dir = a.engram_dir;
  mo.engram_storage.engram_packed = a.engram_packed;
  mo.engram_storage.cache_gib = a.engram_cache_gib;
  mo.corrected_index_keys = a.corrected_index_keys;
  return mo;
}

void check_prompt_ids(const std::vector<int32_t>& prompt, int64_t vocab, const std::string& path) {
  for (size_t i = 0; i < prompt.size(); ++i)
    DSV_CHECK(prompt[i] < vocab, "{}: token id {} at index {} is outside the vocabulary [0, {})", path, prompt[i], i,
              vocab);
}

}  // namespace dsv41::cli
