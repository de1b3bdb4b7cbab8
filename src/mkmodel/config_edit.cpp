#include "mkmodel/config_edit.h"

#include <cmath>
#include <fstream>
#include <set>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"

namespace dsv41::mkmodel {

using json = nlohmann::json;

json read_config_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path);
  try {
    json j = json::parse(in);
    if (!j.is_object()) fail("{}: top level is not a JSON object", path);
    return j;
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

namespace {

json& text_section(json& root) {
  if (root.contains("text_config") && root["text_config"].is_object()) return root["text_config"];
  return root;
}

std::vector<int64_t> int_list(const json& t, const char* key, const std::string& label) {
  if (!t.contains(key)) return {};
  if (!t[key].is_array()) fail("{}: '{}' must be a list of integers", label, key);
  std::vector<int64_t> v;
  for (const auto& x : t[key]) {
    if (!x.is_number_integer()) fail("{}: '{}' must be a list of integers", label, key);
    v.push_back(x.get<int64_t>());
  }
  return v;
}

}  // namespace

void truncate_layers(json& root, int64_t n, const std::string& label) {
  json& t = text_section(root);
  if (!t.contains("num_hidden_layers") || !t["num_hidden_layers"].is_number_integer())
    fail("{}: missing integer 'num_hidden_layers'", label);
  const int64_t old_n = t["num_hidden_layers"].get<int64_t>();
  if (n < 1 || n > old_n) fail("--layers {}: must be between 1 and num_hidden_layers = {}", n, old_n);
  if (n == old_n) return;
  t["num_hidden_layers"] = n;

  std::vector<int64_t> ratios = int_list(t, "compress_ratios", label);
  if (static_cast<int64_t>(ratios.size()) < old_n)
    fail("{}: compress_ratios has {} entries, fewer than num_hidden_layers = {}", label, ratios.size(), old_n);
  std::vector<int64_t> kept(ratios.begin(), ratios.begin() + n);
  kept.insert(kept.end(), ratios.begin() + old_n, ratios.end());
  t["compress_ratios"] = kept;

  for (const char* key : {"kv_source_layer_ids", "index_source_layer_ids"}) {
    if (!t.contains(key)) continue;
    std::vector<int64_t> ids;
    for (int64_t id : int_list(t, key, label))
      if (id < n) ids.push_back(id);
    t[key] = ids;
  }
  if (t.contains("candidate_source_layer_id") && t["candidate_source_layer_id"].is_number_integer() &&
      t["candidate_source_layer_id"].get<int64_t>() >= n)
    t["candidate_source_layer_id"] = -1;

  if (t.contains("engram_layer_ids")) {
    const std::vector<int64_t> ids = int_list(t, "engram_layer_ids", label);
    const std::vector<int64_t> rows = int_list(t, "engram_num_embeddings", label);
    if (rows.size() != ids.size())
      fail("{}: engram_num_embeddings has {} entries, engram_layer_ids {}", label, rows.size(), ids.size());
    std::vector<int64_t> kid, krows;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < n) {
        kid.push_back(ids[i]);
        krows.push_back(rows[i]);
      }
    t["engram_layer_ids"] = kid;
    t["engram_num_embeddings"] = krows;
  }

  if (t.contains("dspark_target_layer_ids")) {
    std::vector<int64_t> taps = int_list(t, "dspark_target_layer_ids", label);
    std::set<int64_t> seen;
    for (auto& id : taps) {
      if (id >= n) id -= old_n - n;
      if (id < 0 || !seen.insert(id).second)
        fail("--layers {}: the DSpark target taps {} cannot be moved into {} layers", n,
             t["dspark_target_layer_ids"].dump(), n);
    }
    t["dspark_target_layer_ids"] = taps;
  }

  const ModelConfig cfg = parse_model_config(root.dump(), label);
  const auto problems = validate_config(cfg);
  if (!problems.empty())
    fail("--layers {}: the truncated config is not valid: {}{}", n, problems.front(),
         problems.size() > 1 ? fmt::format(" (and {} more)", problems.size() - 1) : "");
}

void set_engram_vocab_size(json& root, int64_t v, const std::string& label) {
  json& t = text_section(root);
  if (!t.contains("engram_layer_ids") || int_list(t, "engram_layer_ids", label).empty())
    fail("--engram-vocab-size: the config has no Engram layers");
  if (v < 2) fail("--engram-vocab-size {}: must be at least 2", v);
  t["engram_vocab_size"] = v;
  const ModelConfig cfg = parse_model_config(root.dump(), label);
  std::vector<int64_t> rows;
  for (const auto& primes : engram_column_primes(cfg)) {
    int64_t sum = 0;
    for (int64_t q : primes) sum += q;
    rows.push_back(sum);
  }
  t["engram_num_embeddings"] = rows;
  const auto problems = validate_config(parse_model_config(root.dump(), label));
  if (!problems.empty())
    fail("--engram-vocab-size {}: the config is not valid: {}{}", v, problems.front(),
         problems.size() > 1 ? fmt::format(" (and {} more)", problems.size() - 1) : "");
}

void set_quantization_config(json& root, CheckpointFormat fmt, const BitsPlanResult* plan) {
  json src = root.contains("quantization_config") ? root["quantization_config"] : json();
  json fp8_src;  // the source's FP8 block, if it has one
  if (src.is_object() && src.value("quant_method", "") == "fp8") fp8_src = src;
  if (src.is_object() && src.contains("original_quantization_config") &&
      src["original_quantization_config"].is_object())
    fp8_src = src["original_quantization_config"];

  if (fmt == CheckpointFormat::kFp8) {
    std::string experts = "fp4";
    if (fp8_src.is_object() && fp8_src.contains("expert_dtype") && fp8_src["expert_dtype"].is_string())
      experts = fp8_src["expert_dtype"].get<std::string>();
    root["quantization_config"] = {{"quant_method", "fp8"},       {"activation_scheme", "dynamic"},
                                   {"fmt", "e4m3"},               {"scale_fmt", "ue8m0"},
                                   {"weight_block_size", {32, 32}}, {"expert_dtype", experts}};
    return;
  }
  DSV_ASSERT(plan != nullptr, "EXL3 quantization_config needs a bits plan");
  json q = {{"quant_method", "exl3"},
            {"version", std::string("dsv41-serve ") + DSV41_VERSION + " mkmodel (random weights)"},
            {"bits", std::round(plan->achieved_bits * 100.0) / 100.0},
            {"head_bits", plan->plan.head_bits},
            {"mtp_bits", plan->plan.mtp_bits},
            {"out_scales", "always"},
            {"codebook", plan->plan.codebook}};
  if (fp8_src.is_object()) q["original_quantization_config"] = fp8_src;
  root["quantization_config"] = q;
}

}  // namespace dsv41::mkmodel
