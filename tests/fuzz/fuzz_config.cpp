// libFuzzer target: config.json parsing, structural validation and, for configs that validate
// and are small, the manifest of both checkpoint formats. Only dsv41::Error may escape the code
// under test.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const dsv41::ModelConfig cfg = dsv41::parse_model_config(text, "fuzz.json");
    if (!dsv41::validate_config(cfg).empty()) return 0;
    // Valid configs may still describe millions of tensors; keep each run fast.
    const int64_t layers = cfg.num_hidden_layers + cfg.num_nextn_predict_layers;
    const int64_t experts = std::max(cfg.n_routed_experts, cfg.dspark_experts());
    if (layers * experts > 4096 || cfg.vision.num_hidden_layers > 64) return 0;
    for (auto fmt : {dsv41::CheckpointFormat::kFp8, dsv41::CheckpointFormat::kExl3}) {
      uint64_t bytes = 0;
      for (const auto& t : dsv41::expected_tensors(cfg, fmt)) bytes += t.nbytes();
      volatile uint64_t sink = bytes;
      (void)sink;
    }
  } catch (const dsv41::Error&) {
  }
  return 0;
}
