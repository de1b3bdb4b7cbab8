// Structural checks on a parsed config: everything the forward pass, the checkpoint manifest and
// the Engram hashing rely on (MODEL.md §1, §2, §3, §5). One message per problem, each naming the
// config key at fault, so `inspect` can list them all at once.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"

namespace dsv41 {

namespace {

// Upper bounds that keep every derived size (tensor shapes, byte totals, the manifest's length)
// far inside int64 and in memory; the released model is orders of magnitude below them.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 512;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxRows = int64_t{1} << 40;
constexpr int64_t kMaxEngramColumns = 1024;
// Routed expert matrices over all layers and DSpark stages: the manifest lists each one (with its
// scale or EXL3 side tensors), so this bounds its length and memory. The release has 47,232.
constexpr int64_t kMaxExpertMatrices = int64_t{1} << 19;
// FP8/FP4 weights and every activation quantiser (ActQuant8, QDQ8, QDQ4a) work on 32-wide blocks.
constexpr int64_t kQuantBlock = 32;

struct Problems {
  std::vector<std::string> list;
  template <class... Args>
  void add(fmt::format_string<Args...> f, Args&&... args) {
    list.push_back(fmt::format(f, std::forward<Args>(args)...));
  }
  // true when the value is usable (in range); records a problem otherwise
  bool positive(const char* key, int64_t v, int64_t max = kMaxDim) {
    if (v <= 0) {
      add("{} must be positive (got {})", key, v);
      return false;
    }
    if (v > max) {
      add("{} = {} is larger than the supported maximum {}", key, v, max);
      return false;
    }
    return true;
  }
  void positive_real(const char* key, double v) {
    if (!(v > 0) || v != v || v > 1e300) add("{} must be a positive finite number (got {})", key, v);
  }
  void divisible(const char* what, int64_t v, int64_t by, const char* why) {
    if (v > 0 && by > 0 && v % by != 0) add("{} = {} must be a multiple of {} ({})", what, v, by, why);
  }
};

// Sorted, duplicate-free, every id in [0, n). Returns false (and reports) otherwise.
bool layer_list(Problems& p, const char* key, const std::vector<int64_t>& ids, int64_t n) {
  bool ok = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n) {
      p.add("{}[{}] = {} is not a backbone layer (0..{})", key, i, ids[i], n - 1);
      ok = false;
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      p.add("{} must be strictly increasing ({} follows {})", key, ids[i], ids[i - 1]);
      ok = false;
    }
  }
  return ok;
}

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}
uint64_t pow_mod(uint64_t b, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  b %= m;
  for (; e; e >>= 1, b = mul_mod(b, b, m))
    if (e & 1) r = mul_mod(r, b, m);
  return r;
}

}  // namespace

// Deterministic Miller-Rabin: these bases decide primality for every n < 2^64.
bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) d >>= 1, ++s;
  for (uint64_t a : {2ull, 325ull, 9375ull, 28178ull, 450775ull, 9780504ull, 1795265022ull}) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 0 || x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s && composite; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

std::vector<std::vector<int64_t>> engram_column_primes(const ModelConfig& c) {
  const int64_t cols = c.n_engram_columns();
  if (c.engram_vocab_size <= 0 || c.engram_vocab_size > kMaxRows || cols <= 0 ||
      cols * static_cast<int64_t>(c.engram_layer_ids.size()) > kMaxEngramColumns)
    fail("engram_column_primes: engram sizes out of range (engram_vocab_size {}, {} columns x {} layers)",
         c.engram_vocab_size, cols, c.engram_layer_ids.size());
  // MODEL.md §3.5: one running candidate over all layers and columns, so no prime repeats.
  std::vector<std::vector<int64_t>> out;
  uint64_t p = static_cast<uint64_t>(c.engram_vocab_size - 1);
  for (size_t l = 0; l < c.engram_layer_ids.size(); ++l) {
    std::vector<int64_t> primes;
    for (int64_t col = 0; col < cols; ++col) {
      do ++p;
      while (!is_prime_u64(p));
      primes.push_back(static_cast<int64_t>(p));
    }
    out.push_back(std::move(primes));
  }
  return out;
}

std::vector<std::string> validate_config(const ModelConfig& c) {
  Problems p;

  // ---- identity and storage format ----
  if (c.architecture != "DeepseekV41ForCausalLM")
    p.add("architectures[0] = '{}', expected 'DeepseekV41ForCausalLM'", c.architecture);
  if (c.model_type != "deepseek_v41") p.add("model_type = '{}', expected 'deepseek_v41'", c.model_type);
  if (c.quant.method != "fp8" && c.quant.method != "exl3")
    p.add("quantization_config.quant_method = '{}', expected 'fp8' or 'exl3'", c.quant.method);
  if (c.quant.method == "fp8") {
    if (c.quant.weight_block_size != std::vector<int64_t>{kQuantBlock, kQuantBlock})
      p.add("quantization_config.weight_block_size must be [32, 32] (MODEL.md §3.1)");
    if (c.quant.fmt != "e4m3") p.add("quantization_config.fmt = '{}', expected 'e4m3'", c.quant.fmt);
    if (c.quant.scale_fmt != "ue8m0")
      p.add("quantization_config.scale_fmt = '{}', expected 'ue8m0'", c.quant.scale_fmt);
    if (c.quant.expert_dtype != "fp4" && c.quant.expert_dtype != "fp8")
      p.add("quantization_config.expert_dtype = '{}', expected 'fp4' or 'fp8'", c.quant.expert_dtype);
  }
  if (c.quant.method == "exl3") {
    if (c.quant.head_bits != 0 && c.quant.head_bits != 16 && (c.quant.head_bits < 1 || c.quant.head_bits > 8))
      p.add("quantization_config.head_bits = {}, expected 1..8 or 16 (unquantized)", c.quant.head_bits);
    if (c.quant.mtp_bits != 0 && (c.quant.mtp_bits < 1 || c.quant.mtp_bits > 8))
      p.add("quantization_config.mtp_bits = {}, expected 1..8", c.quant.mtp_bits);
    if (!(c.quant.bits >= 0 && c.quant.bits <= 16)) p.add("quantization_config.bits = {} is out of range", c.quant.bits);
    if (!c.quant.codebook.empty() && c.quant.codebook != "mul1" && c.quant.codebook != "mcg" &&
        c.quant.codebook != "3inst")
      p.add("quantization_config.codebook = '{}', expected mul1, mcg or 3inst", c.quant.codebook);
  }

  // ---- sizes ----
  const bool vocab_ok = p.positive("vocab_size", c.vocab_size);
  const bool dim_ok = p.positive("hidden_size", c.hidden_size);
  const bool layers_ok = p.positive("num_hidden_layers", c.num_hidden_layers, kMaxLayers);
  const bool heads_ok = p.positive("num_attention_heads", c.num_attention_heads);
  const bool hd_ok = p.positive("head_dim", c.head_dim);
  const bool rope_ok = p.positive("qk_rope_head_dim", c.qk_rope_head_dim);
  const bool ql_ok = p.positive("q_lora_rank", c.q_lora_rank);
  const bool og_ok = p.positive("o_groups", c.o_groups);
  const bool ol_ok = p.positive("o_lora_rank", c.o_lora_rank);
  p.positive("sliding_window", c.sliding_window);
  p.positive("max_position_embeddings", c.max_position_embeddings, kMaxRows);
  const bool inter_ok = p.positive("moe_intermediate_size", c.moe_intermediate_size);
  const bool experts_ok = p.positive("n_routed_experts", c.n_routed_experts, kMaxExperts);
  const bool topk_ok = p.positive("num_experts_per_tok", c.num_experts_per_tok, kMaxExperts);
  p.positive("hc_mult", c.hc_mult, 64);
  p.positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1 << 16);
  if (c.num_key_value_heads != 1)
    p.add("num_key_value_heads = {}: the attention has one shared KV vector per token, expected 1", c.num_key_value_heads);
  if (c.n_shared_experts != 1) p.add("n_shared_experts = {}, expected 1", c.n_shared_experts);
  p.positive_real("rms_norm_eps", c.rms_norm_eps);
  p.positive_real("hc_eps", c.hc_eps);
  p.positive_real("rope_theta", c.rope_theta);
  p.positive_real("compress_rope_theta", c.compress_rope_theta);
  p.positive_real("routed_scaling_factor", c.routed_scaling_factor);
  p.positive_real("gate_temp", c.gate_temp);
  if (!(c.swiglu_limit >= 0) || c.swiglu_limit > 1e300) p.add("swiglu_limit must be >= 0 (got {})", c.swiglu_limit);
  if (layers_ok && experts_ok && c.num_nextn_predict_layers >= 0 && c.num_nextn_predict_layers <= 64 &&
      c.dspark_n_routed_experts >= 0 && c.dspark_n_routed_experts <= kMaxExperts) {
    const int64_t matrices = 3 * (c.num_hidden_layers * c.n_routed_experts + c.num_nextn_predict_layers * c.dspark_experts());
    if (matrices > kMaxExpertMatrices)
      p.add("{} routed expert matrices (3 x (num_hidden_layers x n_routed_experts + num_nextn_predict_layers x DSpark "
            "experts)) exceed the supported maximum {}",
            matrices, kMaxExpertMatrices);
  }
  if (topk_ok && experts_ok && c.num_experts_per_tok > c.n_routed_experts)
    p.add("num_experts_per_tok = {} exceeds n_routed_experts = {}", c.num_experts_per_tok, c.n_routed_experts);
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "sigmoid" && c.scoring_func != "softmax")
    p.add("scoring_func = '{}', expected sqrtsoftplus, sigmoid or softmax", c.scoring_func);
  if (c.topk_method != "noaux_tc") p.add("topk_method = '{}', expected 'noaux_tc'", c.topk_method);
  if (c.hidden_act != "silu") p.add("hidden_act = '{}', expected 'silu'", c.hidden_act);
  if (c.attention_bias) p.add("attention_bias = true is not supported (the V4.1 projections have no bias)");

  // ---- token ids ----
  if (vocab_ok) {
    auto token = [&](const char* key, int64_t id, bool optional) {
      if (optional && id < 0) return;
      if (id < 0 || id >= c.vocab_size) p.add("{} = {} is outside the vocabulary (0..{})", key, id, c.vocab_size - 1);
    };
    token("bos_token_id", c.bos_token_id, false);
    token("eos_token_id", c.eos_token_id, false);
    token("pad_token_id", c.pad_token_id, false);
    token("image_token_id", c.image_token_id, true);
    if (!c.engram_layer_ids.empty()) token("engram_pad_token_id", c.engram_pad_token_id, false);
    if (c.num_nextn_predict_layers > 0) token("dspark_noise_token_id", c.dspark_noise_token_id, false);
  }

  // ---- attention geometry ----
  if (hd_ok && rope_ok) {
    if (c.qk_rope_head_dim >= c.head_dim)
      p.add("qk_rope_head_dim = {} must be smaller than head_dim = {}", c.qk_rope_head_dim, c.head_dim);
    if (c.qk_rope_head_dim % 2) p.add("qk_rope_head_dim = {} must be even (RoPE rotates pairs)", c.qk_rope_head_dim);
  }
  if (heads_ok && og_ok) {
    if (c.num_attention_heads % c.o_groups)
      p.add("num_attention_heads = {} must be a multiple of o_groups = {}", c.num_attention_heads, c.o_groups);
    else if (hd_ok && (c.num_attention_heads * c.head_dim) % c.o_groups)
      p.add("num_attention_heads * head_dim = {} must be a multiple of o_groups = {}",
            c.num_attention_heads * c.head_dim, c.o_groups);
  }
  // Every FP8/FP4 matmul quantises its input in 32-blocks; so do the KV and indexer quantisers.
  const char* why = "FP8/FP4 activation blocks of 32";
  if (dim_ok) p.divisible("hidden_size", c.hidden_size, kQuantBlock, why);
  if (ql_ok) p.divisible("q_lora_rank", c.q_lora_rank, kQuantBlock, why);
  if (hd_ok) p.divisible("head_dim", c.head_dim, kQuantBlock, "KV quantisation blocks of 32");
  if (inter_ok) p.divisible("moe_intermediate_size", c.moe_intermediate_size, kQuantBlock, why);
  if (heads_ok && hd_ok && og_ok && c.num_attention_heads % c.o_groups == 0)
    p.divisible("num_attention_heads * head_dim / o_groups (wo_a input)", c.num_attention_heads * c.head_dim / c.o_groups,
                kQuantBlock, why);
  if (og_ok && ol_ok) p.divisible("o_groups * o_lora_rank (wo_b input)", c.o_groups * c.o_lora_rank, kQuantBlock, why);

  // ---- layer schedule ----
  const int64_t nl = c.num_hidden_layers;
  const int64_t expected_ratios = c.num_hidden_layers + c.num_nextn_predict_layers;
  if (c.num_nextn_predict_layers < 0 || c.num_nextn_predict_layers > 64)
    p.add("num_nextn_predict_layers = {} must be in 0..64", c.num_nextn_predict_layers);
  bool ratios_ok = layers_ok && static_cast<int64_t>(c.compress_ratios.size()) == expected_ratios;
  if (layers_ok && !ratios_ok)
    p.add("compress_ratios has {} entries, expected num_hidden_layers + num_nextn_predict_layers = {}",
          c.compress_ratios.size(), expected_ratios);
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int64_t r = c.compress_ratios[i];
    if (r < 0 || r > 2) {
      p.add("compress_ratios[{}] = {}, expected 0, 1 or 2", i, r);
      ratios_ok = false;
    } else if (static_cast<int64_t>(i) >= nl && r != 0 && layers_ok) {
      p.add("compress_ratios[{}] = {}: DSpark stage {} must be window-only (0)", i, r, static_cast<int64_t>(i) - nl);
    }
  }
  const bool kv_ok = layers_ok && layer_list(p, "kv_source_layer_ids", c.kv_source_layer_ids, nl);
  const bool idx_ok = layers_ok && layer_list(p, "index_source_layer_ids", c.index_source_layer_ids, nl);
  if (kv_ok && idx_ok) {
    for (auto s : c.kv_source_layer_ids)
      if (!c.is_index_source(s))
        p.add("kv_source_layer_ids contains {} but index_source_layer_ids does not (index sources must include every KV source)", s);
  }
  if (ratios_ok && kv_ok && idx_ok) {
    for (auto s : c.kv_source_layer_ids)
      if (c.ratio(s) == 0) p.add("kv_source_layer_ids contains {} but compress_ratios[{}] = 0", s, s);
    for (auto s : c.index_source_layer_ids)
      if (c.ratio(s) == 0) p.add("index_source_layer_ids contains {} but compress_ratios[{}] = 0", s, s);
    for (int64_t l = 0; l < nl; ++l) {
      const int64_t r = c.ratio(l);
      if (r == 0) continue;
      const int64_t kv = c.kv_source_for(l), ix = c.index_source_for(l);
      if (kv < 0)
        p.add("compress_ratios[{}] = {} but no kv_source_layer_ids entry is <= {}", l, r, l);
      else if (c.ratio(kv) != r && c.ratio(kv) != 0)  // ratio 0 at a source is reported above
        p.add("layer {} (compress_ratios {}) reads the compressed KV of layer {} whose ratio is {} (kv_source_layer_ids)",
              l, r, kv, c.ratio(kv));
      if (ix < 0) p.add("compress_ratios[{}] = {} but no index_source_layer_ids entry is <= {}", l, r, l);
    }
  }
  const bool any_index = !c.index_source_layer_ids.empty();
  if (any_index) {
    p.positive("index_n_heads", c.index_n_heads);
    const bool id = p.positive("index_head_dim", c.index_head_dim);
    p.positive("index_topk", c.index_topk, kMaxRows);
    if (id) p.divisible("index_head_dim", c.index_head_dim, kQuantBlock, "indexer FP4 quantisation blocks of 32");
    if (id && rope_ok && c.qk_rope_head_dim > c.index_head_dim)
      p.add("qk_rope_head_dim = {} exceeds index_head_dim = {} (the indexer rotates its last qk_rope_head_dim dims)",
            c.qk_rope_head_dim, c.index_head_dim);
  }
  if (c.candidate_source_layer_id != -1) {
    const int64_t cs = c.candidate_source_layer_id;
    if (!c.is_index_source(cs))
      p.add("candidate_source_layer_id = {} is not in index_source_layer_ids", cs);
    else if (ratios_ok && c.ratio(cs) != 1)
      p.add("candidate_source_layer_id = {} has compress_ratios {}, expected 1", cs, c.ratio(cs));
    p.positive("candidate_topk_blocks", c.candidate_topk_blocks, kMaxRows);
    p.positive("candidate_block_size", c.candidate_block_size, kMaxRows);
  } else if (c.candidate_source_layer_id < -1) {
    p.add("candidate_source_layer_id = {}: use -1 for none", c.candidate_source_layer_id);
  }

  // ---- RoPE scaling ----
  if (!c.rope_scaling.type.empty()) {
    if (c.rope_scaling.type != "yarn") p.add("rope_scaling.rope_type = '{}', expected 'yarn'", c.rope_scaling.type);
    p.positive_real("rope_scaling.factor", c.rope_scaling.factor);
    p.positive("rope_scaling.original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings, kMaxRows);
    p.positive_real("rope_scaling.beta_fast", c.rope_scaling.beta_fast);
    p.positive_real("rope_scaling.beta_slow", c.rope_scaling.beta_slow);
  }

  // ---- Engram ----
  if (!c.engram_layer_ids.empty()) {
    const bool ids_ok = layers_ok && layer_list(p, "engram_layer_ids", c.engram_layer_ids, nl);
    bool sizes_ok = ids_ok;
    if (c.engram_num_embeddings.size() != c.engram_layer_ids.size()) {
      p.add("engram_num_embeddings has {} entries, expected one per engram_layer_ids entry ({})",
            c.engram_num_embeddings.size(), c.engram_layer_ids.size());
      sizes_ok = false;
    }
    for (size_t i = 0; i < c.engram_num_embeddings.size(); ++i)
      if (c.engram_num_embeddings[i] <= 0 || c.engram_num_embeddings[i] > kMaxRows) {
        p.add("engram_num_embeddings[{}] = {} is out of range (1..2^40)", i, c.engram_num_embeddings[i]);
        sizes_ok = false;
      }
    if (c.engram_max_ngram_size < 2 || c.engram_max_ngram_size > 64) {
      p.add("engram_max_ngram_size = {} must be in 2..64", c.engram_max_ngram_size);
      sizes_ok = false;
    }
    sizes_ok &= p.positive("engram_n_heads", c.engram_n_heads, kMaxEngramColumns);
    if (p.positive("engram_head_dim", c.engram_head_dim))
      p.divisible("engram_head_dim", c.engram_head_dim, kQuantBlock, "table scales per 32 columns");
    sizes_ok &= p.positive("engram_vocab_size", c.engram_vocab_size, kMaxRows);
    p.positive("engram_compressed_vocab_size", c.engram_compressed_vocab_size, kMaxRows);
    if (sizes_ok && c.n_engram_columns() * static_cast<int64_t>(c.engram_layer_ids.size()) > kMaxEngramColumns) {
      p.add("engram layers x (engram_max_ngram_size - 1) x engram_n_heads = {} columns exceeds {}",
            c.n_engram_columns() * static_cast<int64_t>(c.engram_layer_ids.size()), kMaxEngramColumns);
      sizes_ok = false;
    }
    if (sizes_ok) {
      // MODEL.md §3.5 / §7.12: each table is the concatenation of one prime-sized block per column.
      const auto primes = engram_column_primes(c);
      for (size_t i = 0; i < primes.size(); ++i) {
        int64_t sum = 0;
        for (auto q : primes[i]) sum += q;
        if (sum != c.engram_num_embeddings[i])
          p.add("engram_num_embeddings[{}] = {} but the {} column primes of layer {} sum to {}", i,
                c.engram_num_embeddings[i], primes[i].size(), c.engram_layer_ids[i], sum);
      }
    }
  } else if (!c.engram_num_embeddings.empty()) {
    p.add("engram_num_embeddings has {} entries but engram_layer_ids is empty", c.engram_num_embeddings.size());
  }

  // ---- DSpark ----
  if (c.num_nextn_predict_layers > 0) {
    if (c.dspark_block_size < 2 || c.dspark_block_size > 64)
      p.add("dspark_block_size = {} must be in 2..64 (anchor + at least one draft)", c.dspark_block_size);
    if (c.dspark_target_layer_ids.empty())
      p.add("dspark_target_layer_ids is empty but num_nextn_predict_layers = {}", c.num_nextn_predict_layers);
    else if (layers_ok)
      layer_list(p, "dspark_target_layer_ids", c.dspark_target_layer_ids, nl);
    p.positive("dspark_markov_rank", c.dspark_markov_rank);
    if (c.dspark_n_routed_experts < 0 || c.dspark_n_routed_experts > kMaxExperts)
      p.add("dspark_n_routed_experts = {} is out of range (0 = backbone's)", c.dspark_n_routed_experts);
    if (c.dspark_num_experts_per_tok < 0 || c.dspark_num_experts_per_tok > kMaxExperts)
      p.add("dspark_num_experts_per_tok = {} is out of range (0 = backbone's)", c.dspark_num_experts_per_tok);
    else if (experts_ok && c.dspark_n_routed_experts >= 0 && c.dspark_topk() > c.dspark_experts())
      p.add("dspark_num_experts_per_tok = {} exceeds the DSpark expert count {}", c.dspark_topk(), c.dspark_experts());
  }

  // ---- vision (only shapes its tensors and the routers' bias_vl) ----
  if (c.vision.num_hidden_layers < 0 || c.vision.num_hidden_layers > kMaxLayers)
    p.add("vision_config.num_hidden_layers = {} is out of range", c.vision.num_hidden_layers);
  if (c.vision.enabled()) {
    const bool vh = p.positive("vision_config.hidden_size", c.vision.hidden_size);
    const bool vn = p.positive("vision_config.num_attention_heads", c.vision.num_attention_heads);
    p.positive("vision_config.intermediate_size", c.vision.intermediate_size);
    p.positive("vision_config.patch_size", c.vision.patch_size, 1024);
    p.positive("vision_config.downsample_ratio", c.vision.downsample_ratio, 64);
    if (vh && vn && (c.vision.hidden_size % c.vision.num_attention_heads ||
                     (c.vision.hidden_size / c.vision.num_attention_heads) % 4))
      p.add("vision_config.hidden_size = {} must split into num_attention_heads = {} heads of a multiple of 4 (2-D RoPE)",
            c.vision.hidden_size, c.vision.num_attention_heads);
  }
  return p.list;
}

}  // namespace dsv41
