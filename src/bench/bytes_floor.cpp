// Bytes floor of a decode step (see bytes_floor.h for what is counted and why).
#include "bench/bytes_floor.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "dsv41/common/error.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/manifest.h"

namespace dsv41::bench {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// "layers.12.attn.wq_b.weight" -> 12 and the rest after "layers.12."; -1 for other names.
int64_t layer_of(std::string_view name, std::string_view* rest) {
  if (!starts_with(name, "layers.")) return -1;
  size_t i = 7;
  int64_t v = 0;
  const size_t digits0 = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0');
  if (i == digits0 || i >= name.size() || name[i] != '.') return -1;
  *rest = name.substr(i + 1);
  return v;
}

// Tensors of a layer that a text decode step never reads as weights.
bool skipped_in_layer(std::string_view rest) {
  return starts_with(rest, "engram.embed.") ||       // Engram tables: rows are counted per token
         rest.find("bias_vl") != std::string_view::npos;  // router bias of image tokens
}

// Parts the CUDA path splits across ranks (docs/TENSOR_PARALLEL.md, "CUDA path"; the routed experts
// are counted apart; the rest of a layer, Engram included, is replicated).
bool split_across_ranks(std::string_view rest) {
  return starts_with(rest, "attn.wq_b.") || starts_with(rest, "attn.wo_a.") || starts_with(rest, "attn.wo_b.") ||
         starts_with(rest, "ffn.shared_experts.");
}

}  // namespace

TensorSizes checkpoint_tensor_sizes(const Checkpoint& ckpt) {
  TensorSizes out;
  for (const TensorInfo* t : ckpt.tensors()) out.emplace_back(t->name, t->nbytes);
  return out;
}

TensorSizes manifest_tensor_sizes(const ModelConfig& cfg) {
  TensorSizes out;
  const CheckpointFormat fmt = checkpoint_format(cfg);
  for (const TensorSpec& t : expected_tensors(cfg, fmt, fmt == CheckpointFormat::kExl3 ? exl3_plan_from_config(cfg)
                                                                                        : Exl3Plan{}))
    out.emplace_back(t.name, t.nbytes());
  return out;
}

ModelWeights classify_weights(const ModelConfig& cfg, const TensorSizes& tensors) {
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) w.layers[static_cast<size_t>(l)].layer = l;
  std::vector<int64_t> found(w.layers.size(), 0);
  for (const auto& [name, bytes] : tensors) {
    const auto b = static_cast<int64_t>(bytes);
    std::string_view rest;
    const int64_t L = layer_of(name, &rest);
    if (L >= 0) {
      if (L >= cfg.num_hidden_layers || skipped_in_layer(rest)) continue;
      LayerWeights& lw = w.layers[static_cast<size_t>(L)];
      ++found[static_cast<size_t>(L)];
      if (starts_with(rest, "ffn.experts.")) {
        lw.experts += b;
        // one expert = the tensors of "ffn.experts.E." whose first tensor is w1's weight
        const std::string_view e = rest.substr(12);
        if (e.find(".w1.") != std::string_view::npos &&
            (e.ends_with(".w1.weight") || e.ends_with(".w1.trellis")))
          ++lw.n_experts;
      } else {
        lw.dense += b;
      }
    } else if (name.starts_with("head.")) {
      w.head += b;
    } else if (name.starts_with("embed.")) {
      w.embed += b;
    } else if (name.starts_with("norm.")) {
      w.final_norm += b;
    }
  }
  for (size_t l = 0; l < found.size(); ++l)
    DSV_CHECK(found[l] > 0, "bytes floor: layer {} has no tensors (config has {} layers)", l, cfg.num_hidden_layers);
  DSV_CHECK(w.head > 0 && w.embed > 0, "bytes floor: head.weight / embed.weight missing");
  return w;
}

StateRead decode_state_read(const ModelConfig& c, int64_t layer, int64_t pos, int64_t value_bytes) {
  StateRead r;
  r.window = std::min(pos + 1, c.sliding_window) * c.head_dim * value_bytes;
  const int64_t ratio = c.ratio(layer);
  if (ratio <= 0) return r;
  const int64_t n_vis = (pos + 1) / ratio;
  r.compressed = std::min(c.index_topk, n_vis) * c.head_dim * value_bytes;
  if (c.is_index_source(layer)) {
    int64_t scanned = n_vis;
    const int64_t cand = c.candidate_source_layer_id;
    if (cand >= 0 && layer > cand) scanned = std::min(n_vis, c.candidate_topk_blocks * c.candidate_block_size);
    r.index_keys = scanned * c.index_head_dim * value_bytes;
  }
  if (c.is_kv_source(layer) && ratio > 1) r.carries = 2 * ratio * c.head_dim * 4;  // fp32 kv + score
  return r;
}

int64_t engram_row_bytes_per_token(const ModelConfig& c) {
  const int64_t row = c.engram_head_dim + (c.engram_head_dim + 31) / 32;  // e4m3 values + E8M0 per 32
  return c.n_engram_columns() * row;
}

double expected_distinct_experts(int64_t n_experts, int64_t top_k, int64_t tokens) {
  if (n_experts <= 0 || top_k <= 0 || tokens <= 0) return 0.0;
  const double miss = 1.0 - static_cast<double>(std::min(top_k, n_experts)) / static_cast<double>(n_experts);
  return static_cast<double>(n_experts) * (1.0 - std::pow(miss, static_cast<double>(tokens)));
}

StepBytes decode_step_bytes(const ModelConfig& c, const ModelWeights& w, int64_t batch, int64_t context,
                            int64_t value_bytes) {
  StepBytes s;
  const double distinct = expected_distinct_experts(c.n_routed_experts, c.num_experts_per_tok, batch);
  s.per_layer.assign(w.layers.size(), 0.0);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    const double dense = static_cast<double>(lw.dense);
    const double experts = distinct * static_cast<double>(lw.expert_each());
    const double state = static_cast<double>(batch) *
                         static_cast<double>(decode_state_read(c, lw.layer, context, value_bytes).total());
    const double rows =
        c.is_engram_layer(lw.layer) ? static_cast<double>(batch * engram_row_bytes_per_token(c)) : 0.0;
    s.dense += dense;
    s.experts += experts;
    s.state += state;
    s.engram_rows += rows;
    s.per_layer[l] = dense + experts + state + rows;
  }
  s.head = static_cast<double>(w.head);
  s.embed_norm = static_cast<double>(batch) * static_cast<double>(w.embed) / static_cast<double>(c.vocab_size) +
                 static_cast<double>(w.final_norm);
  return s;
}

TpProjection project_tp2(const ModelConfig& c, const TensorSizes& tensors, const ModelWeights& w, int64_t batch,
                         int64_t context, const TpLink& link, int64_t value_bytes) {
  double split = 0;  // bytes of the split parts of every layer (each node reads half)
  for (const auto& [name, bytes] : tensors) {
    std::string_view rest;
    const int64_t L = layer_of(name, &rest);
    if (L >= 0 && L < c.num_hidden_layers && split_across_ranks(rest)) split += static_cast<double>(bytes);
  }
  const StepBytes s = decode_step_bytes(c, w, batch, context, value_bytes);
  TpProjection p;
  // Replicated: dense minus the split parts, the state (one shared KV head: every node's query
  // heads read all of it), the Engram rows and embedding rows. Halved: split parts, experts, head.
  p.node_bytes = (s.dense - split) + split / 2 + s.experts / 2 + s.state + s.engram_rows + s.head / 2 + s.embed_norm;
  p.memory_s = p.node_bytes / link.node_bandwidth;
  // The CUDA path's exchange (cuda_tp.cpp): all-reduces of zero-filled fp32 buffers. Per layer the
  // attention's z (n·o_groups·o_lora_rank) and wo_b rows (n·hidden), the shared expert's gate/up
  // (2·n·moe_inter), then the MoE rows: FP8/FP4 the routed pairs with the shared rows
  // (n·(top_k + 1)·hidden), EXL3's grouped decode kernels each token's partial sum with the shared
  // rows (2·n·hidden). After the layers, the logits (n·vocab).
  const double n = static_cast<double>(batch), f32 = 4.0;
  const double moe_rows = checkpoint_format(c) == CheckpointFormat::kExl3
                              ? 2.0 * static_cast<double>(c.hidden_size)
                              : static_cast<double>((c.num_experts_per_tok + 1) * c.hidden_size);
  const double per_layer = n * f32 *
                           (static_cast<double>(c.o_groups * c.o_lora_rank + c.hidden_size) +
                            2.0 * static_cast<double>(c.moe_intermediate_size) + moe_rows);
  p.layer_allreduces = 4 * static_cast<int64_t>(w.layers.size());
  p.layer_allreduce_bytes = per_layer * static_cast<double>(w.layers.size());
  p.head_allreduce_bytes = n * f32 * static_cast<double>(c.vocab_size);
  p.totals(link);
  return p;
}

void TpProjection::totals(const TpLink& link) {
  allreduces = layer_allreduces + 1;
  const double bytes = layer_allreduce_bytes + head_allreduce_bytes;
  allreduce_bytes = bytes / static_cast<double>(allreduces);
  // Two ranks: each sends and receives half the payload twice (reduce-scatter, all-gather).
  allreduce_s = static_cast<double>(allreduces) * link.latency_s + bytes / link.link_bandwidth;
}

void TpProjection::scale_layers(double f, const TpLink& link) {
  layer_allreduces = static_cast<int64_t>(static_cast<double>(layer_allreduces) * f + 0.5);
  layer_allreduce_bytes *= f;
  totals(link);
}

}  // namespace dsv41::bench
