// The expected tensor list, from the config alone.
//  FP8 format: MODEL.md §3.2 (names, dtypes and shapes of the release), plus the vision tower as
//    the reference's vision.py declares it (nn.Linear with bias for patch_embed, wqkv, wo and the
//    aligner; no bias for the MLP) and `gate.bias_vl`, both only when `vision_config` is present.
//  EXL3 format: EXL3.md §1.3/§1.8. Quantized: attention projections (wo_a split into o_groups
//    slices), compressor wkv/wgate, indexer wq_b, routed + shared experts, the head (head_bits),
//    the mtp.* projections. Unquantized (planned F16, accepted as F16/BF16/F32): routers,
//    indexer weights_proj and wk, Engram wkv, the Markov and confidence heads, embeddings, norms,
//    mHC parameters, sinks. Engram tables and vision are optional (the tables are read from the
//    original checkpoint through --engram-dir).
#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "loader/manifest_build.h"

namespace dsv41 {

using manifest_detail::ceil_div;
using manifest_detail::Exl3Linear;
using manifest_detail::Manifest;
using manifest_detail::pad128;

int Exl3Plan::bits_for(const std::string& prefix) const {
  auto it = per_linear.find(prefix);
  if (it != per_linear.end()) return it->second;
  if (prefix == "head") return head_bits;
  if (mtp_bits > 0 && prefix.rfind("mtp.", 0) == 0) return mtp_bits;
  return default_bits;
}

Exl3Plan exl3_plan_from_config(const ModelConfig& cfg) {
  Exl3Plan plan;
  if (cfg.quant.bits > 0) plan.default_bits = std::clamp(static_cast<int>(std::lround(cfg.quant.bits)), 1, 8);
  if (cfg.quant.head_bits == 16 || (cfg.quant.head_bits >= 1 && cfg.quant.head_bits <= 8))
    plan.head_bits = cfg.quant.head_bits;
  if (cfg.quant.mtp_bits >= 1 && cfg.quant.mtp_bits <= 8) plan.mtp_bits = cfg.quant.mtp_bits;
  plan.codebook = cfg.quant.codebook;
  return plan;
}

int64_t TensorSpec::numel() const {
  unsigned __int128 n = 1;
  for (auto d : shape) {
    DSV_ASSERT(d >= 0, "tensor {}: negative dimension", name);
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 62)) fail("tensor {}: shape too large", name);
  }
  return static_cast<int64_t>(n);
}

uint64_t TensorSpec::nbytes() const {
  const unsigned __int128 n = static_cast<unsigned __int128>(numel()) * dtype_size(dtype);
  if (n > (static_cast<unsigned __int128>(1) << 62)) fail("tensor {} {}: too many bytes", name, shape_str(shape));
  return static_cast<uint64_t>(n);
}

const char* component_name(Component c) {
  switch (c) {
    case Component::kAttention: return "attention";
    case Component::kRoutedExperts: return "routed_experts";
    case Component::kSharedExperts: return "shared_experts";
    case Component::kEngram: return "engram";
    case Component::kDSpark: return "dspark";
    case Component::kHead: return "head";
    case Component::kEmbedding: return "embedding";
    case Component::kOther: return "other";
    case Component::kVision: return "vision";
  }
  return "other";
}

Component component_of(const std::string& n) {
  auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
  auto has = [&](const char* p) { return n.find(p) != std::string::npos; };
  if (starts("mtp.")) return Component::kDSpark;
  if (starts("embed.")) return Component::kEmbedding;
  if (starts("head.")) return Component::kHead;
  if (starts("vision.") || starts("aligner.") || starts("image_")) return Component::kVision;
  if (has(".engram.")) return Component::kEngram;
  if (has(".ffn.experts.")) return Component::kRoutedExperts;
  if (has(".ffn.shared_experts.")) return Component::kSharedExperts;
  if (has(".attn.")) return Component::kAttention;
  return Component::kOther;
}

CheckpointFormat checkpoint_format(const ModelConfig& cfg) {
  if (cfg.quant.method == "fp8") return CheckpointFormat::kFp8;
  if (cfg.quant.method == "exl3") return CheckpointFormat::kExl3;
  fail("quantization_config.quant_method '{}' is neither 'fp8' nor 'exl3'", cfg.quant.method);
}

namespace manifest_detail {

bool is_engram_table(const std::string& name) {
  return name.find(".engram.embed.") != std::string::npos && name.rfind("mtp.", 0) != 0;
}

namespace {

TensorSpec make_spec(std::string name, DType dt, std::vector<int64_t> shape, Component comp) {
  TensorSpec t;
  t.name = std::move(name);
  t.dtype = dt;
  t.shape = std::move(shape);
  t.component = comp;
  return t;
}

// How a linear is stored in the released (FP8) checkpoint.
enum class Store { kFp8, kFp4, kBf16 };

class Builder {
 public:
  Builder(const ModelConfig& c, CheckpointFormat fmt, const Exl3Plan& plan) : c_(c), fmt_(fmt), plan_(plan) {
    codebook_ = !plan.codebook.empty() ? plan.codebook : !c.quant.codebook.empty() ? c.quant.codebook : "mul1";
    if (codebook_ != "mul1" && codebook_ != "mcg" && codebook_ != "3inst")
      fail("EXL3 plan: unknown codebook '{}' (mul1, mcg or 3inst)", codebook_);
  }

  Manifest take() { return std::move(m_); }

  bool exl3() const { return fmt_ == CheckpointFormat::kExl3; }

  // A tensor that is not part of a linear. In EXL3 the floating ones may come in any float width.
  void tensor(const std::string& name, DType dt, std::vector<int64_t> shape, bool optional = false) {
    TensorSpec t = make_spec(name, dt, std::move(shape), component_of(name));
    t.optional = optional;
    if (exl3() && (dt == DType::BF16 || dt == DType::F32 || dt == DType::F16)) {
      for (DType a : {DType::F16, DType::BF16, DType::F32})
        if (a != dt) t.alt_dtypes.push_back(a);
    }
    push(std::move(t), -1);
  }

  // A linear with weight [out, in]. `quantize` = stored as EXL3 in the EXL3 format (EXL3.md §1.8).
  void linear(const std::string& prefix, int64_t in, int64_t out, Store store, bool quantize, bool bias = false,
              bool optional = false) {
    if (!exl3()) {
      switch (store) {
        case Store::kFp8:
          push_plain(prefix + ".weight", DType::F8_E4M3, {out, in});
          push_plain(prefix + ".scale", DType::F8_E8M0, {ceil_div(out, 32), ceil_div(in, 32)});
          break;
        case Store::kFp4:  // two e2m1 codes per byte, one E8M0 scale per 32 inputs (MXFP4)
          push_plain(prefix + ".weight", DType::I8, {out, in / 2});
          push_plain(prefix + ".scale", DType::F8_E8M0, {out, in / 32});
          break;
        case Store::kBf16:
          push_plain(prefix + ".weight", DType::BF16, {out, in}, optional);
          if (bias) push_plain(prefix + ".bias", DType::BF16, {out}, optional);
          break;
      }
      return;
    }
    const int id = static_cast<int>(m_.linears.size());
    m_.linears.push_back(Exl3Linear{prefix, in, out, bias, optional});
    const int bits = plan_.bits_for(prefix);
    if (quantize && bits != 16) {
      if (bits < 1 || bits > 8) fail("EXL3 plan: K = {} for '{}' (must be 1..8, or 16 for the head)", bits, prefix);
      const int64_t k = pad128(in), n = pad128(out);
      TensorSpec tr = make_spec(prefix + ".trellis", DType::I16, {k / 16, n / 16, 16 * int64_t{bits}}, component_of(prefix));
      tr.exl3_trellis = true;
      push_linear(std::move(tr), id, prefix, optional);
      push_linear(make_spec(prefix + ".suh", DType::F16, {k}, component_of(prefix)), id, prefix, optional);
      push_linear(make_spec(prefix + ".svh", DType::F16, {n}, component_of(prefix)), id, prefix, optional);
      if (codebook_ != "3inst")
        push_linear(make_spec(prefix + "." + codebook_, DType::I32, {}, component_of(prefix)), id, prefix, optional);
      if (bias) push_linear(make_spec(prefix + ".bias", DType::F16, {n}, component_of(prefix)), id, prefix, optional);
    } else {
      TensorSpec w = make_spec(prefix + ".weight", DType::F16, {out, in}, component_of(prefix));
      w.alt_dtypes = {DType::BF16, DType::F32};
      push_linear(std::move(w), id, "", optional);
      if (bias) {
        TensorSpec b = make_spec(prefix + ".bias", DType::F16, {out}, component_of(prefix));
        b.alt_dtypes = {DType::BF16, DType::F32};
        push_linear(std::move(b), id, "", optional);
      }
    }
  }

  void block(const std::string& p, int64_t layer, bool mtp) {
    const ModelConfig& c = c_;
    const int64_t D = c.hidden_size, H = c.num_attention_heads, HD = c.head_dim, QL = c.q_lora_rank;
    const int64_t G = c.o_groups, OL = c.o_lora_rank, hc = c.hc_mult, mix = (2 + hc) * hc;
    tensor(p + "attn_norm.weight", DType::BF16, {D});
    tensor(p + "ffn_norm.weight", DType::BF16, {D});
    for (const char* site : {"attn", "ffn"}) {
      tensor(p + "hc_" + site + "_fn", DType::F32, {mix, hc * D});
      tensor(p + "hc_" + site + "_base", DType::F32, {mix});
      tensor(p + "hc_" + site + "_scale", DType::F32, {3});
    }

    // attention (MODEL.md §3.2; layer roles §2)
    const std::string a = p + "attn.";
    tensor(a + "attn_sink", DType::F32, {H});
    tensor(a + "q_norm.weight", DType::BF16, {QL});
    tensor(a + "kv_norm.weight", DType::BF16, {HD});
    linear(a + "wq_a", D, QL, Store::kFp8, true);
    linear(a + "wq_b", QL, H * HD, Store::kFp8, true);
    linear(a + "wkv", D, HD, Store::kFp8, true);
    const int64_t group_width = H * HD / G;
    if (exl3()) {
      // EXL3.md §1.8: the single wo_a is split row-wise into o_groups linears.
      for (int64_t g = 0; g < G; ++g) linear(a + "wo_a.slice." + std::to_string(g), group_width, OL, Store::kFp8, true);
    } else {
      linear(a + "wo_a", group_width, G * OL, Store::kFp8, true);
    }
    linear(a + "wo_b", G * OL, D, Store::kFp8, true);
    if (!mtp && c.is_kv_source(layer)) {
      linear(a + "compressor.wkv", D, HD, Store::kBf16, true);
      if (c.ratio(layer) > 1) linear(a + "compressor.wgate", D, HD, Store::kBf16, true);
      tensor(a + "compressor.norm.weight", DType::BF16, {HD});
      linear(a + "indexer.wk", HD, c.index_head_dim, Store::kBf16, false);
      tensor(a + "indexer.k_norm.weight", DType::BF16, {c.index_head_dim});
    }
    if (!mtp && c.is_index_source(layer)) {
      linear(a + "indexer.wq_b", QL, c.index_n_heads * c.index_head_dim, Store::kFp8, true);
      linear(a + "indexer.weights_proj", D, c.index_n_heads, Store::kBf16, false);
    }

    // Engram (MODEL.md §3.2, §5.3): table rows of engram_head_dim, scales per 32 columns
    if (!mtp && c.is_engram_layer(layer)) {
      const int64_t rows = c.engram_num_embeddings.at(static_cast<size_t>(c.engram_index(layer)));
      const int64_t ehd = c.engram_head_dim;
      const std::string e = p + "engram.";
      if (exl3()) {
        TensorSpec w = make_spec(e + "embed.weight", DType::F8_E4M3, {rows, ehd}, Component::kEngram);
        w.optional = true;
        w.alt_dtypes = {DType::F16, DType::BF16};
        push(std::move(w), -1);
        tensor(e + "embed.scale", DType::F8_E8M0, {rows, ehd / 32}, true);
      } else {
        tensor(e + "embed.weight", DType::F8_E4M3, {rows, ehd});
        tensor(e + "embed.scale", DType::F8_E8M0, {rows, ehd / 32});
      }
      // one key per stream plus a shared value (engram.py: wkv out = dim * (hc_mult + 1))
      linear(e + "wkv", c.n_engram_columns() * ehd, (hc + 1) * D, Store::kFp8, false);
      tensor(e + "q_weight", DType::BF16, {hc, D});
      tensor(e + "k_weight", DType::BF16, {hc, D});
    }

    // MoE: router, routed experts, one shared expert
    const std::string f = p + "ffn.";
    const int64_t E = mtp ? c.dspark_experts() : c.n_routed_experts;
    const int64_t I = c.moe_intermediate_size;
    linear(f + "gate", D, E, Store::kBf16, false);
    tensor(f + "gate.bias", DType::F32, {E});
    if (c.vision.enabled()) tensor(f + "gate.bias_vl", DType::F32, {E});  // image tokens' routing bias
    const Store es = c.quant.expert_dtype == "fp8" ? Store::kFp8 : Store::kFp4;
    for (int64_t x = 0; x < E; ++x) {
      const std::string ep = f + "experts." + std::to_string(x) + ".";
      linear(ep + "w1", D, I, es, true);
      linear(ep + "w2", I, D, es, true);
      linear(ep + "w3", D, I, es, true);
    }
    linear(f + "shared_experts.w1", D, I, Store::kFp8, true);
    linear(f + "shared_experts.w2", I, D, Store::kFp8, true);
    linear(f + "shared_experts.w3", D, I, Store::kFp8, true);
  }

  void vision() {
    const VisionConfig& v = c_.vision;
    const bool opt = exl3();  // a text-only EXL3 conversion may drop the vision tower
    const int64_t VD = v.hidden_size, D = c_.hidden_size, r = v.downsample_ratio;
    linear("vision.patch_embed.proj", 3 * v.patch_size * v.patch_size, VD, Store::kBf16, false, true, opt);
    for (int64_t i = 0; i < v.num_hidden_layers; ++i) {
      const std::string b = "vision.blocks." + std::to_string(i) + ".";
      tensor(b + "norm1.weight", DType::BF16, {VD}, opt);
      linear(b + "attn.wqkv", VD, 3 * VD, Store::kBf16, false, true, opt);
      linear(b + "attn.wo", VD, VD, Store::kBf16, false, true, opt);
      tensor(b + "norm2.weight", DType::BF16, {VD}, opt);
      linear(b + "mlp.w1", VD, 2 * v.intermediate_size, Store::kBf16, false, false, opt);
      linear(b + "mlp.w2", v.intermediate_size, VD, Store::kBf16, false, false, opt);
    }
    tensor("vision.norm.weight", DType::BF16, {VD}, opt);
    linear("aligner.w1", VD * r * r, D, Store::kBf16, false, true, opt);
    linear("aligner.w2", D, D, Store::kBf16, false, true, opt);
    for (const char* n : {"image_start", "image_end", "image_newline"}) tensor(n, DType::BF16, {D}, opt);
  }

  void model() {
    const ModelConfig& c = c_;
    const int64_t D = c.hidden_size, V = c.vocab_size;
    tensor("embed.weight", DType::BF16, {V, D});
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) block("layers." + std::to_string(l) + ".", l, false);
    tensor("norm.weight", DType::BF16, {D});
    linear("head", D, V, Store::kBf16, true);
    const int64_t S = c.num_nextn_predict_layers;
    for (int64_t s = 0; s < S; ++s) {
      const std::string p = "mtp." + std::to_string(s) + ".";
      block(p, c.num_hidden_layers + s, true);
      if (s == 0) {  // concatenated target taps -> hidden
        const int64_t taps = static_cast<int64_t>(c.dspark_target_layer_ids.size());
        linear(p + "main_proj", taps * D, D, Store::kFp8, true);
        tensor(p + "main_norm.weight", DType::BF16, {D});
      }
      if (s == S - 1) {
        const int64_t R = c.dspark_markov_rank;
        tensor(p + "norm.weight", DType::BF16, {D});
        tensor(p + "markov_head.embed.weight", DType::BF16, {V, R});
        linear(p + "markov_head.head", R, V, Store::kBf16, false);
        linear(p + "confidence_head.proj", D + R, 1, Store::kBf16, false);
      }
    }
    if (c.vision.enabled()) vision();
  }

 private:
  void push(TensorSpec t, int linear) {
    m_.tensors.push_back(std::move(t));
    m_.linear_of.push_back(linear);
  }
  void push_plain(const std::string& name, DType dt, std::vector<int64_t> shape, bool optional = false) {
    TensorSpec t = make_spec(name, dt, std::move(shape), component_of(name));
    t.optional = optional;
    push(std::move(t), -1);
  }
  void push_linear(TensorSpec t, int id, const std::string& exl3_prefix, bool optional) {
    t.exl3_linear = exl3_prefix;
    t.optional = optional;
    push(std::move(t), id);
  }

  const ModelConfig& c_;
  CheckpointFormat fmt_;
  const Exl3Plan& plan_;
  std::string codebook_;
  Manifest m_;
};

}  // namespace

Manifest build_manifest(const ModelConfig& cfg, CheckpointFormat fmt, const Exl3Plan& plan) {
  // Shapes are only meaningful (and bounded) for a valid config.
  const auto problems = validate_config(cfg);
  if (!problems.empty())
    fail("cannot derive the tensor manifest: the config is invalid: {}{}", problems.front(),
         problems.size() > 1 ? fmt::format(" (and {} more problems)", problems.size() - 1) : "");
  Builder b(cfg, fmt, plan);
  b.model();
  Manifest m = b.take();
  // Every tensor is below 2^62 bytes (nbytes()); their sum must stay that far inside uint64 too,
  // so that every byte total derived from the manifest (inspect, mkmodel) is exact.
  unsigned __int128 total = 0;
  for (const TensorSpec& t : m.tensors) total += t.nbytes();
  if (total > (static_cast<unsigned __int128>(1) << 62))
    fail("cannot derive the tensor manifest: the config describes more than 2^62 bytes of tensors");
  return m;
}

}  // namespace manifest_detail

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, CheckpointFormat fmt, const Exl3Plan& plan) {
  return manifest_detail::build_manifest(cfg, fmt, plan).tensors;
}

}  // namespace dsv41
