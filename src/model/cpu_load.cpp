// Loading the CPU reference engine's weights: names and shapes from MODEL.md §3.2, every size
// from config.json. Load-time conversions follow the release's loader: wo_a dequantised to BF16,
// ratio>1 compressor weights and the head/Markov/confidence weights widened to fp32 (exact).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/exl3/exl3_linear.h"
#include "dsv41/dist/collective.h"
#include "model/cpu_impl.h"
#include "model/linears.h"

namespace dsv41::model {
namespace {

HcWeights load_hc(const Checkpoint& ck, const std::string& p, const std::string& site, const ModelConfig& c) {
  const int64_t hc = c.hc_mult, mix = (2 + hc) * hc;
  HcWeights w;
  w.fn = load_f32(ck, p + ".hc_" + site + "_fn", {mix, hc * c.hidden_size});
  w.base = load_f32(ck, p + ".hc_" + site + "_base", {mix});
  w.scale = load_f32(ck, p + ".hc_" + site + "_scale", {3});
  return w;
}

// A [rows, cols] float matrix read row by row at run time (embeddings, dense heads).
void check_dense_matrix(const TensorInfo& t, int64_t rows, int64_t cols) {
  DSV_CHECK(t.shape == std::vector<int64_t>({rows, cols}), "tensor {} has shape {}, expected [{}, {}]", t.name,
            t.shape_str(), rows, cols);
  DSV_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32,
            "tensor {}: dtype {} where BF16/F16/F32 is expected", t.name, dtype_name(t.dtype));
}

Expert load_expert(const Checkpoint& ck, const std::string& p, int64_t dim, int64_t inter) {
  Expert e;
  e.w1 = load_linear(ck, p + ".w1", dim, inter);
  e.w2 = load_linear(ck, p + ".w2", inter, dim);
  e.w3 = load_linear(ck, p + ".w3", dim, inter);
  return e;
}

}  // namespace

void CpuModel::Impl::load_block(BlockWeights& b, const std::string& prefix, int64_t layer, bool is_dspark) {
  const ModelConfig& c = cfg;
  const Checkpoint& ck = *ckpt;
  const int64_t dim = c.hidden_size, hd = c.head_dim, H = c.num_attention_heads;
  b.prefix = prefix;
  b.layer = layer;
  b.ratio = c.ratio(layer);
  b.is_dspark = is_dspark;
  b.rope = RopeTable::for_ratio(c, b.ratio);
  b.attn_norm = load_f32(ck, prefix + ".attn_norm.weight", {dim});
  b.ffn_norm = load_f32(ck, prefix + ".ffn_norm.weight", {dim});
  b.hc_attn = load_hc(ck, prefix, "attn", c);
  b.hc_ffn = load_hc(ck, prefix, "ffn", c);

  AttnWeights& a = b.attn;
  const std::string ap = prefix + ".attn";
  a.wq_a = load_linear(ck, ap + ".wq_a", dim, c.q_lora_rank);
  a.wq_b = load_linear(ck, ap + ".wq_b", c.q_lora_rank, H * hd);
  a.wkv = load_linear(ck, ap + ".wkv", dim, hd);
  a.wo_b = load_linear(ck, ap + ".wo_b", c.o_groups * c.o_lora_rank, dim);
  a.q_norm = load_f32(ck, ap + ".q_norm.weight", {c.q_lora_rank});
  a.kv_norm = load_f32(ck, ap + ".kv_norm.weight", {hd});
  a.sink = load_f32(ck, ap + ".attn_sink", {H});
  const int64_t in_g = H * hd / c.o_groups;
  if (ck.has(ap + ".wo_a.slice.0.trellis") || ck.has(ap + ".wo_a.slice.0.weight")) {
    // EXL3 layout (EXL3.md §1.8): one linear per group, each EXL3 or left unquantized.
    for (int64_t g = 0; g < c.o_groups; ++g)
      a.wo_a.push_back(
          load_linear(ck, ap + ".wo_a.slice." + std::to_string(g), in_g, c.o_lora_rank, LinearKind::kBF16));
  } else {
    // The reference dequantises wo_a to BF16 and runs it as a grouped BF16 matmul (a BF16, F16 or
    // F32 wo_a is used as stored). Group g is rows [g·R, (g+1)·R) of the stored matrix.
    const bool fp8 = ck.get(ap + ".wo_a.weight").dtype == DType::F8_E4M3;
    const int64_t R = c.o_lora_rank;
    for (int64_t g = 0; g < c.o_groups; ++g) {
      std::vector<float> w = load_dense_weight_rows(ck, ap + ".wo_a", in_g, c.o_groups * R, g * R, (g + 1) * R);
      if (fp8) round_to_bf16(w);
      a.wo_a.push_back(make_dense_linear(std::move(w), in_g, R));
    }
  }
  if (!is_dspark && c.is_kv_source(layer)) {
    const LinearKind k = b.ratio > 1 ? LinearKind::kF32 : LinearKind::kBF16;
    a.c_wkv = load_linear(ck, ap + ".compressor.wkv", dim, hd, k);
    if (b.ratio > 1) a.c_wgate = load_linear(ck, ap + ".compressor.wgate", dim, hd, k);
    a.c_norm = load_f32(ck, ap + ".compressor.norm.weight", {hd});
    if (c.is_index_source(layer)) {
      a.i_wk = load_linear(ck, ap + ".indexer.wk", hd, c.index_head_dim, LinearKind::kBF16);
      a.i_k_norm = load_f32(ck, ap + ".indexer.k_norm.weight", {c.index_head_dim});
    }
  }
  if (!is_dspark && c.is_index_source(layer)) {
    a.i_wq_b = load_linear(ck, ap + ".indexer.wq_b", c.q_lora_rank, c.index_n_heads * c.index_head_dim);
    a.i_weights_proj = load_linear(ck, ap + ".indexer.weights_proj", dim, c.index_n_heads, LinearKind::kBF16);
  }

  MoeWeights& m = b.ffn;
  const std::string fp = prefix + ".ffn";
  m.n_experts = is_dspark && c.dspark_n_routed_experts > 0 ? c.dspark_n_routed_experts : c.n_routed_experts;
  m.top_k = is_dspark && c.dspark_num_experts_per_tok > 0 ? c.dspark_num_experts_per_tok : c.num_experts_per_tok;
  m.gate_w = load_f32(ck, fp + ".gate.weight", {m.n_experts, dim});
  m.gate_bias = load_f32(ck, fp + ".gate.bias", {m.n_experts});
  // Tensor parallel: a rank holds the routed experts [expert_begin, expert_end) only.
  m.expert_begin = 0;
  m.expert_end = m.n_experts;
  if (tp_world > 1) {
    const dist::Range r = dist::split_range(m.n_experts, tp_rank, tp_world);
    m.expert_begin = r.begin;
    m.expert_end = r.end;
  }
  for (int64_t e = 0; e < m.n_experts; ++e)
    m.experts.push_back(e >= m.expert_begin && e < m.expert_end
                            ? load_expert(ck, fp + ".experts." + std::to_string(e), dim, c.moe_intermediate_size)
                            : Expert{});
  m.shared = load_expert(ck, fp + ".shared_experts", dim, c.moe_intermediate_size);

  if (!is_dspark && c.is_engram_layer(layer)) {
    auto e = std::make_unique<EngramWeights>();
    const std::string ep = prefix + ".engram";
    e->hash_index = c.engram_index(layer);
    const int64_t hdim = c.engram_head_dim;
    e->wkv = load_linear(ck, ep + ".wkv", c.n_engram_columns() * hdim, dim * (c.hc_mult + 1));
    const auto q = load_f32(ck, ep + ".q_weight", {c.hc_mult, dim});
    const auto k = load_f32(ck, ep + ".k_weight", {c.hc_mult, dim});
    e->gate_w.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) e->gate_w[i] = q[i] * k[i];
    b.engram = std::move(e);
  }
  a.n_heads = H;
  if (b.engram) b.engram->col_end = c.n_engram_columns();
  if (tp_world > 1) tp_split_block(b, prefix, is_dspark);  // this rank's share (src/model/tp_parts.cpp)
}

void CpuModel::Impl::load(const std::string& dir) {
  const auto t_start = std::chrono::steady_clock::now();
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  cfg = load_model_config(dir + "/config.json");
  const auto problems = validate_config(cfg);
  if (!problems.empty())
    fail("{}/config.json: {}{}", dir, problems.front(),
         problems.size() > 1 ? fmt::format(" (and {} more)", problems.size() - 1) : std::string());
  // Engram tables read from elsewhere may be missing from the folder (their shards are skipped).
  CheckpointOpenOptions co;
  if (!opts.engram_storage.engram_packed.empty()) co.engram_elsewhere = "--engram-packed " + opts.engram_storage.engram_packed;
  else if (!opts.engram_storage.engram_dir.empty()) co.engram_elsewhere = "--engram-dir " + opts.engram_storage.engram_dir;
  else if (opts.engram_store) co.engram_elsewhere = "the Engram store given to the model";
  ckpt = Checkpoint::open(dir, co);
  const ModelConfig& c = cfg;
  if (opts.tp) {
    tp = opts.tp.get();
    tp_rank = tp->rank();
    tp_world = tp->world_size();
    // A packed Engram folder holds one pack per rank: open this rank's.
    if (opts.engram_storage.world_size == 1) {
      opts.engram_storage.rank = tp_rank;
      opts.engram_storage.world_size = tp_world;
    }
  }
  vocab_begin = 0;
  vocab_end = c.vocab_size;
  if (tp_world > 1) {
    const dist::Range v = dist::split_range(c.vocab_size, tp_rank, tp_world);
    vocab_begin = v.begin;
    vocab_end = v.end;
  }
  DSV_CHECK(c.n_shared_experts == 1, "config: n_shared_experts = {} (the reference supports exactly 1)",
            c.n_shared_experts);
  DSV_CHECK(c.hc_mult >= 1 && c.hc_mult <= 16, "config: hc_mult = {} out of range", c.hc_mult);
  DSV_CHECK(c.head_dim % 32 == 0 && c.index_head_dim % 32 == 0 && c.hidden_size % 32 == 0,
            "config: hidden_size, head_dim and index_head_dim must be multiples of 32");
  embed = &ckpt->get("embed.weight");
  // The head is a plain float matrix (release: BF16; EXL3 with head_bits 16: F16) read row by row,
  // or an EXL3 linear (EXL3.md §1.8, head_bits 1..8).
  if (exl3::is_exl3_linear(*ckpt, "head")) head_linear = load_linear(*ckpt, "head", c.hidden_size, c.vocab_size);
  else head = &ckpt->get("head.weight");
  for (const TensorInfo* t : {embed, head}) {
    if (t == nullptr) continue;
    check_dense_matrix(*t, c.vocab_size, c.hidden_size);
  }
  final_norm = load_f32(*ckpt, "norm.weight", {c.hidden_size});
  blocks.resize(static_cast<size_t>(c.num_hidden_layers));
  const auto t_layers = std::chrono::steady_clock::now();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    load_block(blocks[static_cast<size_t>(l)], "layers." + std::to_string(l), l, false);
  const double layers_s = seconds_since(t_layers);

  engram_hash = build_engram_hashes(c);
  // Table rows: a store handed in by the caller, else one opened from the storage options
  // (packed files > --engram-dir > the tables inside this checkpoint).
  engram_store = opts.engram_store ? opts.engram_store : engram::open_engram_store(c, ckpt.get(), opts.engram_storage);
  if (engram_store)
    DSV_CHECK(engram_store->geometry().fingerprint() == engram::EngramGeometry::from_config(c).fingerprint(),
              "engram store geometry '{}' does not match this config ('{}')", engram_store->geometry().fingerprint(),
              engram::EngramGeometry::from_config(c).fingerprint());
  if (!c.engram_layer_ids.empty()) {
    token_map = load_engram_token_map(opts.engram_token_map, c, &engram_pad);
  }

  if (opts.dspark && c.num_nextn_predict_layers > 0 && c.dspark_block_size > 0) {
    const int64_t S = c.num_nextn_predict_layers, dim = c.hidden_size;
    dspark.resize(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) {
      load_block(dspark[static_cast<size_t>(s)], "mtp." + std::to_string(s), c.num_hidden_layers + s, true);
      DSV_CHECK(dspark[static_cast<size_t>(s)].ratio == 0, "config: DSpark stage {} has compress ratio {} (must be 0)",
                s, dspark[static_cast<size_t>(s)].ratio);
    }
    const std::string last = "mtp." + std::to_string(S - 1);
    const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size()), rank = c.dspark_markov_rank;
    DSV_CHECK(nt > 0, "config: DSpark needs dspark_target_layer_ids");
    for (int64_t t : c.dspark_target_layer_ids)
      DSV_CHECK(t >= 0 && t < c.num_hidden_layers, "config: DSpark target layer {} out of range", t);
    dspark_head.main_proj = load_linear(*ckpt, "mtp.0.main_proj", nt * dim, dim);
    dspark_head.main_norm = load_f32(*ckpt, "mtp.0.main_norm.weight", {dim});
    dspark_head.norm = load_f32(*ckpt, last + ".norm.weight", {dim});
    dspark_head.markov_embed = &ckpt->get(last + ".markov_head.embed.weight");
    check_dense_matrix(*dspark_head.markov_embed, c.vocab_size, rank);
    // The Markov and confidence heads are plain float matrices, or EXL3 linears when a conversion
    // quantized them (the MTP projections are quantized with mtp_bits, EXL3.md §1.5).
    const std::string mh = last + ".markov_head.head", ch = last + ".confidence_head.proj";
    if (exl3::is_exl3_linear(*ckpt, mh)) {
      dspark_head.markov_head_linear = load_linear(*ckpt, mh, rank, c.vocab_size);
    } else {
      dspark_head.markov_head = &ckpt->get(mh + ".weight");
      check_dense_matrix(*dspark_head.markov_head, c.vocab_size, rank);
    }
    if (exl3::is_exl3_linear(*ckpt, ch)) dspark_head.confidence_linear = load_linear(*ckpt, ch, dim + rank, 1);
    else dspark_head.confidence = load_f32(*ckpt, ch + ".weight", {1, dim + rank});
  }
  // Start-up phases (issue 11): the backbone layers dominate; the rest is Engram, token map, DSpark.
  spdlog::info("cpu model loaded in {:.2f} s: {} layers {:.2f} s ({:.3f} s per layer), {} DSpark stages",
               seconds_since(t_start), blocks.size(), layers_s,
               blocks.empty() ? 0.0 : layers_s / static_cast<double>(blocks.size()), dspark.size());
}

}  // namespace dsv41::model
