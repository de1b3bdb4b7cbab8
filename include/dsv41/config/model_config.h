// DeepSeek-V4.1 model configuration, parsed from the HF config.json (`text_config` uses the
// released key names, MODEL.md §1). Every size the engine uses comes from here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv41 {

struct RopeScaling {
  std::string type;  // "yarn" or "" (none)
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
};

struct QuantizationConfig {
  std::string method;                 // "fp8" (released) or "exl3"
  std::string fmt = "e4m3";
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";   // fp8 method: routed experts in fp4 (e2m1) or fp8
  std::vector<int64_t> weight_block_size = {32, 32};
  // exl3 method
  double bits = 0.0;
  int head_bits = 0;
  std::string codebook;
  int mtp_bits = 0;  // exl3: K of the DSpark (mtp.*) linears when the file says so (0 = unknown)
};

// vision_config (HF names). The engine is text-only; these sizes only shape the vision tensors of
// the checkpoint manifest (MODEL.md §3.2) and the MoE routers' `bias_vl` (present iff vision is).
struct VisionConfig {
  int64_t num_hidden_layers = 0;  // 0 = no vision tower
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t patch_size = 0;
  double rope_theta = 10000.0;
  int64_t downsample_ratio = 1;
  int64_t max_image_tokens = 0;
  int64_t min_pixels = 0;
  bool enabled() const { return num_hidden_layers > 0; }
};

struct ModelConfig {
  // root
  std::string architecture;  // "DeepseekV41ForCausalLM"
  std::string model_type;    // "deepseek_v41"
  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = 2;
  int64_t image_token_id = -1;
  QuantizationConfig quant;

  // text_config
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // dim
  int64_t num_hidden_layers = 0;      // backbone blocks
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t sliding_window = 0;
  std::vector<int64_t> compress_ratios;  // num_hidden_layers + num_nextn_predict_layers entries
  double compress_rope_theta = 160000.0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  std::vector<int64_t> kv_source_layer_ids;
  std::vector<int64_t> index_source_layer_ids;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t candidate_source_layer_id = -1;
  int64_t candidate_topk_blocks = 0, candidate_block_size = 0;
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-20;
  int64_t n_routed_experts = 0, num_experts_per_tok = 0, n_shared_experts = 1;
  int64_t moe_intermediate_size = 0;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::string hidden_act = "silu";
  double swiglu_limit = 0.0;
  double gate_temp = 1.0;  // not in the released config; the reference's default
  std::vector<int64_t> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int64_t engram_max_ngram_size = 0, engram_n_heads = 0, engram_head_dim = 0;
  int64_t engram_vocab_size = 0, engram_pad_token_id = 2, engram_compressed_vocab_size = 0;
  int64_t num_nextn_predict_layers = 0;  // DSpark stages
  int64_t dspark_block_size = 0, dspark_noise_token_id = 0;
  std::vector<int64_t> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0, dspark_n_routed_experts = 0, dspark_num_experts_per_tok = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;

  VisionConfig vision;  // root `vision_config`; absent = no vision tower

  // ---- derived helpers ----
  int64_t ratio(int64_t layer) const { return compress_ratios.at(static_cast<size_t>(layer)); }
  bool is_kv_source(int64_t layer) const;
  bool is_index_source(int64_t layer) const;
  bool is_engram_layer(int64_t layer) const;
  int64_t engram_index(int64_t layer) const;        // position in engram_layer_ids, or -1
  int64_t kv_source_for(int64_t layer) const;       // latest KV source <= layer (-1 if none)
  int64_t index_source_for(int64_t layer) const;    // latest index source <= layer (-1 if none)
  int64_t n_engram_columns() const { return (engram_max_ngram_size - 1) * engram_n_heads; }
  int64_t n_total_layers() const { return num_hidden_layers + num_nextn_predict_layers; }
  // Routed experts / top-k of a DSpark stage: the dspark_* values, or the backbone's when 0
  // (the reference's ModelArgs.get_moe_config).
  int64_t dspark_experts() const { return dspark_n_routed_experts > 0 ? dspark_n_routed_experts : n_routed_experts; }
  int64_t dspark_topk() const { return dspark_num_experts_per_tok > 0 ? dspark_num_experts_per_tok : num_experts_per_tok; }
};

// Parses config.json (root + text_config). Throws dsv41::Error naming the file and key for a
// missing key or a wrong type. Does not check structural constraints: see validate_config.
ModelConfig load_model_config(const std::string& path);
ModelConfig parse_model_config(const std::string& json_text, const std::string& label);

// Every structural constraint the forward pass relies on; returns one message per problem, each
// naming the config key at fault (empty = valid).
std::vector<std::string> validate_config(const ModelConfig& c);

// The prime row count of every Engram column, per Engram layer in engram_layer_ids order
// (MODEL.md §3.5: one running search upward from engram_vocab_size - 1, no prime used twice).
// A table's rows are these blocks back to back, so each layer's primes sum to its
// engram_num_embeddings. Throws dsv41::Error when the Engram sizes are out of range.
std::vector<std::vector<int64_t>> engram_column_primes(const ModelConfig& c);
bool is_prime_u64(uint64_t n);

}  // namespace dsv41
