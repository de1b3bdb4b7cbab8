#include "cli/inspect_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

namespace dsv41::cli {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Integer after `marker` in `name` (e.g. the expert id after "experts."), or -1.
int64_t index_after(const std::string& name, const char* marker) {
  const size_t at = name.find(marker);
  if (at == std::string::npos) return -1;
  size_t i = at + std::char_traits<char>::length(marker);
  int64_t v = 0;
  bool any = false;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && v < (int64_t{1} << 40)) {
    v = v * 10 + (name[i++] - '0');
    any = true;
  }
  return any ? v : -1;
}

// Bytes of `total` that rank r holds when split evenly over n ranks (the remainder goes to the
// first ranks, as a ceil split would).
uint64_t even_share(uint64_t total, int r, int n) {
  const uint64_t base = total / static_cast<uint64_t>(n), rem = total % static_cast<uint64_t>(n);
  return base + (static_cast<uint64_t>(r) < rem ? 1 : 0);
}

// Owner rank of item i of `count` items split into contiguous blocks over n ranks.
int block_owner(int64_t i, int64_t count, int n) {
  if (count <= 0) return 0;
  const int64_t per = (count + n - 1) / n;
  return static_cast<int>(std::min<int64_t>(i / per, n - 1));
}

enum class Split { kReplicated, kEven, kExpert, kWoaSlice };

Split split_of(const std::string& n) {
  if (has(n, ".ffn.experts.")) return Split::kExpert;
  if (has(n, ".attn.wo_a.slice.")) return Split::kWoaSlice;
  if (n.rfind("embed.", 0) == 0 || n.rfind("head.", 0) == 0 || has(n, ".markov_head.")) return Split::kEven;
  if (has(n, ".engram.embed.")) return Split::kEven;  // table rows split (ceil(rows / N) each)
  if (has(n, ".attn.wq_b.") || has(n, ".attn.wo_a.") || has(n, ".attn.wo_b.") || ends_with(n, ".attn.attn_sink") ||
      has(n, ".indexer.wq_b.") || has(n, ".indexer.weights_proj."))
    return Split::kEven;
  return Split::kReplicated;
}

}  // namespace

double Exl3Stats::mean_k() const {
  if (weights == 0) return 0;
  // each linear's K weighted by its weights: sum(K * w) / sum(w) = trellis bits / weights
  return trellis_bits_ / static_cast<double>(weights);
}

double Exl3Stats::bits_per_weight() const {
  return weights ? 8.0 * static_cast<double>(storage_bytes) / static_cast<double>(weights) : 0;
}

std::vector<TensorRow> rows_from_manifest(const std::vector<TensorSpec>& specs) {
  std::vector<TensorRow> rows;
  rows.reserve(specs.size());
  for (const auto& s : specs) rows.push_back(TensorRow{s.name, s.dtype, s.shape, s.nbytes()});
  return rows;
}

uint64_t parameters_of(const TensorRow& t) {
  const std::string& n = t.name;
  if (ends_with(n, ".scale") || ends_with(n, ".suh") || ends_with(n, ".svh") || ends_with(n, ".su") ||
      ends_with(n, ".sv") || ends_with(n, ".mul1") || ends_with(n, ".mcg"))
    return 0;
  if (ends_with(n, ".trellis") && t.shape.size() == 3)
    return static_cast<uint64_t>(t.shape[0]) * 16 * static_cast<uint64_t>(t.shape[1]) * 16;
  if (t.dtype == DType::I8) return 2 * numel(t.shape);  // packed FP4 (two e2m1 codes per byte)
  return numel(t.shape);
}

Report make_report(const std::vector<TensorRow>& rows, const ModelConfig* cfg, int world_size) {
  Report r;
  const int N = std::max(1, world_size);
  r.ranks.resize(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) r.ranks[static_cast<size_t>(i)].rank = i;
  std::unordered_map<std::string, const TensorRow*> by_name;
  for (const auto& t : rows) by_name.emplace(t.name, &t);

  for (const auto& t : rows) {
    const Component c = component_of(t.name);
    const auto ci = static_cast<size_t>(c);
    const uint64_t params = parameters_of(t);
    ++r.n_tensors;
    r.total_bytes += t.nbytes;
    r.parameters += params;
    r.components[ci].tensors += 1;
    r.components[ci].parameters += params;
    r.components[ci].bytes += t.nbytes;

    if (ends_with(t.name, ".trellis") && t.shape.size() == 3 && t.shape[2] % 16 == 0) {
      const std::string prefix = t.name.substr(0, t.name.size() - 8);
      uint64_t storage = t.nbytes;
      for (const char* aux : {".suh", ".svh", ".su", ".sv"}) {
        auto it = by_name.find(prefix + aux);
        if (it != by_name.end()) storage += it->second->nbytes;
      }
      const int K = static_cast<int>(t.shape[2] / 16);
      for (Exl3Stats* s : {&r.exl3, &r.exl3_by_component[ci]}) {
        s->linears += 1;
        s->weights += params;
        s->storage_bytes += storage;
        s->k_histogram[K] += 1;
        s->add_trellis_bits(static_cast<double>(K) * static_cast<double>(params));
      }
    }

    // ---- per-rank placement ----
    const bool vision = c == Component::kVision;
    const bool table = has(t.name, ".engram.embed.");
    for (int rk = 0; rk < N; ++rk) {
      uint64_t share = 0;
      switch (split_of(t.name)) {
        case Split::kReplicated: share = t.nbytes; break;
        case Split::kEven: share = even_share(t.nbytes, rk, N); break;
        case Split::kExpert: {
          const int64_t e = index_after(t.name, ".ffn.experts.");
          int64_t count = 0;
          if (cfg) count = t.name.rfind("mtp.", 0) == 0 ? cfg->dspark_experts() : cfg->n_routed_experts;
          share = (count > 0 && block_owner(e, count, N) == rk) || (count <= 0 && e % N == rk) ? t.nbytes : 0;
          break;
        }
        case Split::kWoaSlice: {
          const int64_t g = index_after(t.name, ".wo_a.slice.");
          const int64_t groups = cfg ? cfg->o_groups : g + 1;
          share = block_owner(g, groups, N) == rk ? t.nbytes : 0;
          break;
        }
      }
      RankEstimate& re = r.ranks[static_cast<size_t>(rk)];
      if (vision) re.vision_bytes += share;
      else if (table) re.engram_table_bytes += share;
      else re.resident_bytes += share;
      re.by_component[ci] += share;
    }
  }
  return r;
}

std::string architecture_summary(const ModelConfig& c) {
  std::string s;
  s += fmt::format("  vocab {}, hidden {}, {} layers + {} DSpark stages, {} query heads x {} (RoPE {}), "
                   "q_lora {}, output {} groups x {}\n",
                   c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_nextn_predict_layers,
                   c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.q_lora_rank, c.o_groups, c.o_lora_rank);
  s += fmt::format("  MoE: {} routed experts (top {}) + {} shared, width {}; DSpark: {} experts (top {}), block {}\n",
                   c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size,
                   c.dspark_experts(), c.dspark_topk(), c.dspark_block_size);
  std::vector<std::string> window, full, reindex, reuse;
  for (int64_t l = 0; l < c.num_hidden_layers && l < static_cast<int64_t>(c.compress_ratios.size()); ++l) {
    const std::string id = std::to_string(l);
    if (c.ratio(l) == 0) window.push_back(id);
    else if (c.is_kv_source(l)) full.push_back(id + "(r" + std::to_string(c.ratio(l)) + ")");
    else if (c.is_index_source(l)) reindex.push_back(id);
    else reuse.push_back(id);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string o;
    for (size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + v[i];
    return o.empty() ? std::string("-") : o;
  };
  s += fmt::format("  layer roles: window-only [{}]; full (compressor+indexer) [{}]; reindex [{}]; reuse [{}]\n",
                   join(window), join(full), join(reindex), join(reuse));
  std::vector<std::string> eng;
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i)
    eng.push_back(fmt::format("{} ({} rows)", c.engram_layer_ids[i],
                              i < c.engram_num_embeddings.size() ? c.engram_num_embeddings[i] : 0));
  s += fmt::format("  Engram layers: [{}]; candidate source: {}; window {}; index top-k {}\n", join(eng),
                   c.candidate_source_layer_id, c.sliding_window, c.index_topk);
  if (c.vision.enabled())
    s += fmt::format("  vision tower: {} layers x {} (in the checkpoint; not used by this engine)\n",
                     c.vision.num_hidden_layers, c.vision.hidden_size);
  return s;
}

}  // namespace dsv41::cli
