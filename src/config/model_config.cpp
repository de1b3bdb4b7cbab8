#include "dsv41/config/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dsv41/common/error.h"

namespace dsv41 {

using json = nlohmann::json;

namespace {

// An integer JSON value (or a float with an exact integer value, e.g. 4.0) that fits in int64.
// Unsigned values above INT64_MAX and non-finite or fractional floats are rejected.
bool as_int64(const json& p, int64_t& v) {
  if (p.is_number_unsigned()) {
    const uint64_t u = p.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    v = static_cast<int64_t>(u);
    return true;
  }
  if (p.is_number_integer()) {
    v = p.get<int64_t>();
    return true;
  }
  if (p.is_number_float()) {
    const double d = p.get<double>();
    // the range check comes first: casting an out-of-range double to int64 is undefined
    if (!(d >= -9.2e18 && d <= 9.2e18) || d != std::floor(d)) return false;
    v = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

// Typed reads with precise errors. `req` = key must be present.
struct Reader {
  const json& j;
  std::string where;

  const json* at(const char* key, bool req) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (req) fail("{}: missing key '{}'", where, key);
      return nullptr;
    }
    return &*it;
  }
  void get(const char* key, int64_t& v, bool req = true) const {
    if (auto p = at(key, req)) {
      if (!as_int64(*p, v)) fail("{}: key '{}' must be an integer", where, key);
    }
  }
  void get(const char* key, double& v, bool req = true) const {
    if (auto p = at(key, req)) {
      if (!p->is_number()) fail("{}: key '{}' must be a number", where, key);
      v = p->get<double>();
    }
  }
  void get(const char* key, bool& v, bool req = true) const {
    if (auto p = at(key, req)) {
      if (!p->is_boolean()) fail("{}: key '{}' must be true or false", where, key);
      v = p->get<bool>();
    }
  }
  void get(const char* key, std::string& v, bool req = true) const {
    if (auto p = at(key, req)) {
      if (!p->is_string()) fail("{}: key '{}' must be a string", where, key);
      v = p->get<std::string>();
    }
  }
  void get(const char* key, std::vector<int64_t>& v, bool req = true) const {
    if (auto p = at(key, req)) {
      if (!p->is_array()) fail("{}: key '{}' must be an array of integers", where, key);
      v.clear();
      for (const auto& e : *p) {
        int64_t x = 0;
        if (!as_int64(e, x)) fail("{}: key '{}' must be an array of integers", where, key);
        v.push_back(x);
      }
    }
  }
};

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

bool ModelConfig::is_kv_source(int64_t l) const { return contains(kv_source_layer_ids, l); }
bool ModelConfig::is_index_source(int64_t l) const { return contains(index_source_layer_ids, l); }
bool ModelConfig::is_engram_layer(int64_t l) const { return contains(engram_layer_ids, l); }
int64_t ModelConfig::engram_index(int64_t l) const {
  auto it = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), l);
  return it == engram_layer_ids.end() ? -1 : it - engram_layer_ids.begin();
}
int64_t ModelConfig::kv_source_for(int64_t l) const {
  int64_t best = -1;
  for (auto s : kv_source_layer_ids)
    if (s <= l && s > best) best = s;
  return best;
}
int64_t ModelConfig::index_source_for(int64_t l) const {
  int64_t best = -1;
  for (auto s : index_source_layer_ids)
    if (s <= l && s > best) best = s;
  return best;
}

ModelConfig parse_model_config(const std::string& text, const std::string& label) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", label, e.what());
  }
  if (!root.is_object()) fail("{}: top level is not a JSON object", label);
  ModelConfig c;
  Reader r{root, label};
  if (auto a = r.at("architectures", false)) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) fail("{}: 'architectures' must be a list of names", label);
    c.architecture = (*a)[0].get<std::string>();
  }
  r.get("model_type", c.model_type, false);
  r.get("bos_token_id", c.bos_token_id, false);
  r.get("eos_token_id", c.eos_token_id, false);
  r.get("pad_token_id", c.pad_token_id, false);
  r.get("image_token_id", c.image_token_id, false);

  if (auto q = r.at("quantization_config", false)) {
    if (!q->is_object()) fail("{}: 'quantization_config' must be an object", label);
    Reader rq{*q, label + ": quantization_config"};
    rq.get("quant_method", c.quant.method);
    rq.get("fmt", c.quant.fmt, false);
    rq.get("scale_fmt", c.quant.scale_fmt, false);
    rq.get("expert_dtype", c.quant.expert_dtype, false);
    rq.get("weight_block_size", c.quant.weight_block_size, false);
    rq.get("bits", c.quant.bits, false);
    int64_t hb = 0;
    rq.get("head_bits", hb, false);
    c.quant.head_bits = static_cast<int>(hb);
    rq.get("codebook", c.quant.codebook, false);
    int64_t mb = 0;
    rq.get("mtp_bits", mb, false);
    c.quant.mtp_bits = static_cast<int>(mb);
    if (hb < INT32_MIN || hb > INT32_MAX || mb < INT32_MIN || mb > INT32_MAX)
      fail("{}: quantization_config: head_bits/mtp_bits out of range", label);
  }

  if (auto v = r.at("vision_config", false)) {
    if (!v->is_object()) fail("{}: 'vision_config' must be an object", label);
    Reader rv{*v, label + ": vision_config"};
    rv.get("num_hidden_layers", c.vision.num_hidden_layers);
    rv.get("hidden_size", c.vision.hidden_size);
    rv.get("num_attention_heads", c.vision.num_attention_heads);
    rv.get("intermediate_size", c.vision.intermediate_size);
    rv.get("patch_size", c.vision.patch_size);
    rv.get("rope_theta", c.vision.rope_theta, false);
    rv.get("downsample_ratio", c.vision.downsample_ratio);
    rv.get("max_image_tokens", c.vision.max_image_tokens, false);
    rv.get("min_pixels", c.vision.min_pixels, false);
  }

  // text_config: nested in the HF file; a flat file (all keys at the root) is accepted too.
  const json* tc = &root;
  if (auto t = r.at("text_config", false)) {
    if (!t->is_object()) fail("{}: 'text_config' must be an object", label);
    tc = t;
  }
  Reader t{*tc, tc == &root ? label : label + ": text_config"};
  t.get("vocab_size", c.vocab_size);
  t.get("hidden_size", c.hidden_size);
  t.get("num_hidden_layers", c.num_hidden_layers);
  t.get("num_attention_heads", c.num_attention_heads);
  t.get("num_key_value_heads", c.num_key_value_heads, false);
  t.get("head_dim", c.head_dim);
  t.get("qk_rope_head_dim", c.qk_rope_head_dim);
  t.get("q_lora_rank", c.q_lora_rank);
  t.get("o_groups", c.o_groups);
  t.get("o_lora_rank", c.o_lora_rank);
  t.get("sliding_window", c.sliding_window);
  t.get("compress_ratios", c.compress_ratios);
  t.get("compress_rope_theta", c.compress_rope_theta);
  t.get("rope_theta", c.rope_theta);
  if (auto rs = t.at("rope_scaling", false)) {
    if (!rs->is_object()) fail("{}: 'rope_scaling' must be an object", t.where);
    Reader rr{*rs, t.where + ": rope_scaling"};
    rr.get("rope_type", c.rope_scaling.type, false);
    if (c.rope_scaling.type.empty()) rr.get("type", c.rope_scaling.type, false);
    rr.get("factor", c.rope_scaling.factor);
    rr.get("beta_fast", c.rope_scaling.beta_fast, false);
    rr.get("beta_slow", c.rope_scaling.beta_slow, false);
    rr.get("original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings);
  }
  t.get("max_position_embeddings", c.max_position_embeddings);
  t.get("kv_source_layer_ids", c.kv_source_layer_ids);
  t.get("index_source_layer_ids", c.index_source_layer_ids);
  t.get("index_n_heads", c.index_n_heads);
  t.get("index_head_dim", c.index_head_dim);
  t.get("index_topk", c.index_topk);
  t.get("candidate_source_layer_id", c.candidate_source_layer_id);
  t.get("candidate_topk_blocks", c.candidate_topk_blocks);
  t.get("candidate_block_size", c.candidate_block_size);
  t.get("hc_mult", c.hc_mult);
  t.get("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  t.get("hc_eps", c.hc_eps);
  t.get("rms_norm_eps", c.rms_norm_eps);
  t.get("n_routed_experts", c.n_routed_experts);
  t.get("num_experts_per_tok", c.num_experts_per_tok);
  t.get("n_shared_experts", c.n_shared_experts, false);
  t.get("moe_intermediate_size", c.moe_intermediate_size);
  t.get("scoring_func", c.scoring_func, false);
  t.get("topk_method", c.topk_method, false);
  t.get("norm_topk_prob", c.norm_topk_prob, false);
  t.get("routed_scaling_factor", c.routed_scaling_factor);
  t.get("hidden_act", c.hidden_act, false);
  t.get("swiglu_limit", c.swiglu_limit);
  t.get("gate_temp", c.gate_temp, false);
  t.get("engram_layer_ids", c.engram_layer_ids);
  t.get("engram_num_embeddings", c.engram_num_embeddings);
  t.get("engram_max_ngram_size", c.engram_max_ngram_size);
  t.get("engram_n_heads", c.engram_n_heads);
  t.get("engram_head_dim", c.engram_head_dim);
  t.get("engram_vocab_size", c.engram_vocab_size);
  t.get("engram_pad_token_id", c.engram_pad_token_id, false);
  t.get("engram_compressed_vocab_size", c.engram_compressed_vocab_size);
  t.get("num_nextn_predict_layers", c.num_nextn_predict_layers);
  t.get("dspark_block_size", c.dspark_block_size);
  t.get("dspark_noise_token_id", c.dspark_noise_token_id);
  t.get("dspark_target_layer_ids", c.dspark_target_layer_ids);
  t.get("dspark_markov_rank", c.dspark_markov_rank);
  t.get("dspark_n_routed_experts", c.dspark_n_routed_experts);
  t.get("dspark_num_experts_per_tok", c.dspark_num_experts_per_tok);
  t.get("tie_word_embeddings", c.tie_word_embeddings, false);
  t.get("attention_bias", c.attention_bias, false);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace dsv41
