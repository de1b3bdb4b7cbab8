// Human tables and JSON of `dsv41-serve bench decode|prefill` (model_bench.h).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "bench/model_bench.h"

namespace dsv41::bench {
namespace {

using Json = nlohmann::ordered_json;

double gb(double bytes) { return bytes / 1e9; }

// Launches the host issued: eager kernel launches plus graph launches (a kernel captured into a
// graph is launched with its graph). Without activity records, the runtime-API kernel launches.
int64_t host_launches(const ProfileCounts& c) {
  if (c.has_activity) return c.kernels_executed - c.graph_kernels + c.graph_launches;
  return c.launches > 0 ? c.launches : c.kernels_executed;
}

Json counts_json(const ProfileCounts& c, int64_t steps, int64_t batch, size_t top) {
  Json j;
  const double per_tok = static_cast<double>(steps * batch);
  j["profiled_steps"] = steps;
  j["launches"] = c.launches;
  j["launches_per_token"] = static_cast<double>(c.launches) / per_tok;
  j["copies_per_token"] = static_cast<double>(c.copies) / per_tok;
  j["syncs_per_token"] = static_cast<double>(c.syncs) / per_tok;
  j["graph_launches"] = c.graph_launches;
  j["graph_launches_per_token"] = static_cast<double>(c.graph_launches) / per_tok;
  j["host_launches_per_token"] = static_cast<double>(host_launches(c)) / per_tok;
  j["activity"] = c.has_activity;
  if (c.has_activity) {
    j["kernels_executed"] = c.kernels_executed;
    j["kernels_executed_per_token"] = static_cast<double>(c.kernels_executed) / per_tok;
    j["graph_kernels"] = c.graph_kernels;
    j["kernel_ms"] = c.kernel_ns * 1e-6;
    j["copy_ms"] = c.copy_ns * 1e-6;
    j["gpu_busy_ms"] = c.busy_ns * 1e-6;
    Json ks = Json::array();
    for (size_t i = 0; i < c.kernels.size() && i < top; ++i)
      ks.push_back({{"name", c.kernels[i].name}, {"count", c.kernels[i].count}, {"ms", c.kernels[i].total_ns * 1e-6}});
    j["kernels"] = ks;
    // totals over the profiled steps, like kernel_ms; idle_ms_per_step divides by the steps
    Json gj;
    gj["idle_ms"] = c.idle_ns * 1e-6;
    gj["idle_ms_per_step"] = c.idle_ns * 1e-6 / static_cast<double>(steps);
    gj["gaps"] = c.idle_gaps;
    Json top_gaps = Json::array();
    for (size_t i = 0; i < c.gaps.size() && i < top; ++i)
      top_gaps.push_back({{"after", c.gaps[i].after},
                          {"before", c.gaps[i].before},
                          {"count", c.gaps[i].count},
                          {"total_us", c.gaps[i].total_ns * 1e-3},
                          {"max_us", c.gaps[i].max_ns * 1e-3}});
    gj["largest"] = top_gaps;
    j["idle_gaps"] = gj;
  }
  return j;
}

// The idle-gap report of one profiled stretch: total and the largest groups (after X, before Y).
std::string gap_lines(const ProfileCounts& c, double steps, size_t top) {
  std::string s;
  for (size_t i = 0; i < c.gaps.size() && i < top; ++i) {
    const IdleGap& gp = c.gaps[i];
    s += fmt::format("    after {:<30} before {:<30} {:>6.1f} gaps {:>9.1f} us  (max {:.1f} us)\n", gp.after, gp.before,
                     static_cast<double>(gp.count) / steps, gp.total_ns * 1e-3 / steps, gp.max_ns * 1e-3);
  }
  return s;
}

std::string kernel_lines(const ProfileCounts& c, double denom_ms, size_t top, const char* unit) {
  std::string s;
  for (size_t i = 0; i < c.kernels.size() && i < top; ++i)
    s += fmt::format("    {:<34} {:>7} calls {:>10.3f} ms  ({:.1f} % of {})\n", c.kernels[i].name, c.kernels[i].count,
                     c.kernels[i].total_ns * 1e-6, 100.0 * c.kernels[i].total_ns * 1e-6 / denom_ms, unit);
  return s;
}

}  // namespace

// The layer-by-layer times and the full model's layers by kind (LayerExtrapolation).
std::string kind_lines(const std::vector<double>& layer_ms, double rest_ms, const LayerExtrapolation& ex,
                       const std::string& what) {
  std::string s = "  " + what + ", this model's layers (ms):";
  for (double t : layer_ms) s += fmt::format(" {:.4f}", t);
  s += fmt::format("; the rest {:.4f}, kept\n", rest_ms);
  for (const KindEstimate& k : ex.kinds) {
    std::string from;
    for (int64_t i : k.measured) from += (from.empty() ? "" : ", ") + std::to_string(i);
    s += fmt::format("  {:>4} x {}: {:.4f} ms each ({} {}{})\n", k.count, describe(k.kind), k.ms,
                     k.exact ? "as layer" : "nearest kind: layer", from,
                     k.plus_engram ? fmt::format(" + the Engram branch, {:.4f}", ex.engram_ms) : "");
  }
  return s;
}

Json kinds_json(const std::vector<double>& layer_ms, double rest_ms, const LayerExtrapolation& ex) {
  Json kinds = Json::array();
  for (const KindEstimate& k : ex.kinds)
    kinds.push_back({{"kind", describe(k.kind)}, {"count", k.count}, {"ms", k.ms}, {"measured_layers", k.measured},
                     {"exact", k.exact}, {"plus_engram", k.plus_engram}});
  return {{"layer_ms", layer_ms}, {"rest_ms", rest_ms}, {"total_ms", ex.total_ms}, {"engram_ms", ex.engram_ms},
          {"engram_measured", ex.engram_measured}, {"kinds", kinds}};
}

std::string format_decode(const DecodeReport& r) {
  const BenchCommon& o = r.opts.common;
  std::string s = fmt::format("bench decode: {} ({} layers) on {}; {} timed steps after {} warm-up, median\n",
                              r.model_dir, r.layers, r.device, r.opts.steps, r.opts.warmup);
  s += fmt::format("floor: bytes a step must read / {:.2f} TB/s; launch counts: {}\n", o.copy_bandwidth / 1e12,
                   r.profile_note);
  s += "launch/t: launches the host issued per token (eager kernels + graph launches); graph/t: of them CUDA graph "
       "launches; kern/t: kernels the GPU executed per token; graphs / eager: ms/step with the decode CUDA graphs on / off "
       "(ms/step is the model's mode; launch counts are of that mode)\n";
  s += fmt::format("{:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>9} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9}\n",
                   "batch", "context", "ms/step", "graphs", "eager", "no-head", "ms/layer/tok", "tokens/s", "launch/t",
                   "graph/t", "kern/t", "sync/t", "floor GB", "floor ms", "%roofline");
  for (const DecodeRow& w : r.rows) {
    const double per_tok = static_cast<double>(w.profiled_steps * w.batch);
    auto count = [&](auto get) {
      return w.counts ? fmt::format("{:.1f}", static_cast<double>(get(*w.counts)) / per_tok) : std::string("-");
    };
    const std::string launches = count([](const ProfileCounts& c) { return host_launches(c); });
    const std::string graph = count([](const ProfileCounts& c) { return c.graph_launches; });
    const std::string kern = w.counts && w.counts->has_activity
                                 ? count([](const ProfileCounts& c) { return c.kernels_executed; })
                                 : std::string("-");
    const std::string syncs = count([](const ProfileCounts& c) { return c.syncs; });
    const std::string with_graphs = w.step_ms_graphs > 0 ? fmt::format("{:.3f}", w.step_ms_graphs) : std::string("-");
    const std::string eager = w.step_ms_no_graphs > 0 ? fmt::format("{:.3f}", w.step_ms_no_graphs) : std::string("-");
    s += fmt::format(
        "{:>5} {:>8} {:>10.3f} {:>10} {:>10} {:>10.3f} {:>12.4f} {:>10.1f} {:>9} {:>8} {:>8} {:>9} {:>8.3f} {:>10.4f} {:>8.2f}%\n",
        w.batch, w.context, w.step_ms, with_graphs, eager, w.step_ms_no_head, w.ms_per_layer_token, w.tokens_per_s, launches, graph,
        kern, syncs, gb(w.floor.total()), w.floor_ms, w.roofline_pct);
  }
  s += "floor parts per step (GB): dense weights, routed experts (expected distinct), state, Engram rows, head\n";
  for (const DecodeRow& w : r.rows)
    s += fmt::format("  batch {} context {}: {:.4f} + {:.4f} + {:.4f} + {:.6f} + {:.4f}\n", w.batch, w.context,
                     gb(w.floor.dense), gb(w.floor.experts), gb(w.floor.state), gb(w.floor.engram_rows),
                     gb(w.floor.head));
  for (const DecodeRow& w : r.rows) {
    if (!w.counts || !w.counts->has_activity) continue;
    const double step_ms = w.step_ms;
    const double per = static_cast<double>(w.profiled_steps);
    s += fmt::format("kernels, batch {} context {}: GPU busy {:.3f} ms of {:.3f} ms per step ({:.0f} %), {} kernels per step\n",
                     w.batch, w.context, w.counts->busy_ns * 1e-6 / per, step_ms,
                     100.0 * w.counts->busy_ns * 1e-6 / per / step_ms,
                     static_cast<double>(w.counts->kernels_executed) / per);
    s += kernel_lines(*w.counts, w.counts->busy_ns * 1e-6, 6, "busy");
  }
  for (const DecodeRow& w : r.rows) {
    if (!w.counts || !w.counts->has_activity) continue;
    const double per = static_cast<double>(w.profiled_steps);
    s += fmt::format("idle gaps, batch {} context {}: GPU idle {:.3f} ms per step in {:.1f} gaps between busy "
                     "intervals (from the first to the last of the profiled steps); per step, largest first:\n",
                     w.batch, w.context, w.counts->idle_ns * 1e-6 / per, static_cast<double>(w.counts->idle_gaps) / per);
    s += gap_lines(*w.counts, per, 10);
  }
  if (r.opts.spec_tokens > 0) {
    s += fmt::format("speculation: DSpark drafts + verify forwards, accepts simulated at rate {:.3f} ({})\n",
                     r.spec_rate, r.spec_rate_source);
    s += fmt::format("{:>5} {:>8} {:>3} {:>12} {:>14} {:>9} {:>12} {:>10} {:>10} {:>12}\n", "batch", "context", "k",
                     "tokens/s", "spec tokens/s", "speedup", "mean acc.", "step ms", "draft ms", "verify ms");
    for (const DecodeRow& w : r.rows)
      if (w.has_spec)
        s += fmt::format("{:>5} {:>8} {:>3} {:>12.1f} {:>14.1f} {:>8.2f}x {:>12.3f} {:>10.3f} {:>10.3f} {:>12.3f}\n",
                         w.batch, w.context, w.spec_k, w.tokens_per_s, w.spec_tokens_per_s,
                         w.spec_tokens_per_s / w.tokens_per_s, w.spec_mean_accepted, w.spec_step_ms, w.spec_draft_ms,
                         w.spec_verify_ms);
  }
  if (r.full.layers > 0) {
    const bool by_kind = !r.rows.empty() && r.rows[0].by_kind.has_value();
    s += fmt::format(
        "extrapolated to {} layers ({}): {} + head; TP2 = 2 nodes at {:.0f} GB/s each, "
        "{} all-reduces per step at {:.0f} us + bytes / {:.1f} GB/s (assumed, not measured)\n",
        r.full.layers, r.full.from_config ? "bytes from --full-config" : "bytes scaled per layer",
        by_kind ? "each layer timed, the full model's layers by kind (below)"
                : fmt::format("per-layer time of this run x {}", r.full.layers),
        o.tp.node_bandwidth / 1e9, r.rows.empty() ? 0 : r.rows[0].tp2.allreduces, o.tp.latency_s * 1e6,
        o.tp.link_bandwidth / 1e9);
    s += fmt::format("{:>5} {:>8} {:>12} {:>10} {:>12} {:>12} {:>12} {:>14} {:>12}\n", "batch", "context", "full ms/step",
                     "tokens/s", "floor ms", "TP2 node GB", "TP2 floor ms", "TP2 at this eff", "TP2 tok/s");
    for (const DecodeRow& w : r.rows)
      s += fmt::format("{:>5} {:>8} {:>12.3f} {:>10.1f} {:>12.3f} {:>12.3f} {:>12.3f} {:>14.3f} {:>12.1f}\n", w.batch,
                       w.context, w.full_step_ms, w.full_tokens_per_s, w.full_floor_ms, gb(w.tp2.node_bytes),
                       w.tp2_step_ms, w.tp2_at_measured_ms, static_cast<double>(w.batch) * 1e3 / w.tp2_at_measured_ms);
    for (const DecodeRow& w : r.rows)
      if (w.by_kind)
        s += kind_lines(w.layer_ms, w.rest_ms, *w.by_kind, fmt::format("batch {} context {}", w.batch, w.context));
  }
  return s;
}

std::string decode_json(const DecodeReport& r) {
  const BenchCommon& o = r.opts.common;
  Json j;
  j["bench"] = "decode";
  j["model"] = r.model_dir;
  j["device"] = r.device;
  j["layers"] = r.layers;
  j["steps"] = r.opts.steps;
  j["warmup"] = r.opts.warmup;
  j["copy_bandwidth"] = o.copy_bandwidth;
  j["profile"] = r.profile_note;
  if (r.opts.spec_tokens > 0) j["spec"] = {{"tokens", r.opts.spec_tokens}, {"accept_rate", r.spec_rate}, {"source", r.spec_rate_source}};
  Json rows = Json::array();
  for (const DecodeRow& w : r.rows) {
    Json x;
    x["batch"] = w.batch;
    x["context"] = w.context;
    x["step_ms"] = w.step_ms;
    x["step_ms_min"] = w.step_ms_min;
    x["step_ms_no_head"] = w.step_ms_no_head;
    x["cuda_graphs"] = w.cuda_graphs;
    if (w.step_ms_graphs > 0) x["step_ms_graphs"] = w.step_ms_graphs;
    if (w.step_ms_no_graphs > 0) x["step_ms_no_graphs"] = w.step_ms_no_graphs;
    x["ms_per_layer"] = w.ms_per_layer;
    x["ms_per_layer_token"] = w.ms_per_layer_token;
    x["tokens_per_s"] = w.tokens_per_s;
    x["floor_bytes"] = {{"dense", w.floor.dense},     {"experts", w.floor.experts}, {"state", w.floor.state},
                        {"engram_rows", w.floor.engram_rows}, {"head", w.floor.head}, {"embed_norm", w.floor.embed_norm},
                        {"total", w.floor.total()},   {"per_layer", w.floor.per_layer}};
    x["floor_ms"] = w.floor_ms;
    x["roofline_pct"] = w.roofline_pct;
    if (w.counts) x["counts"] = counts_json(*w.counts, w.profiled_steps, w.batch, 12);
    if (w.has_spec)
      x["spec"] = {{"k", w.spec_k},
                   {"accept_rate", r.spec_rate},
                   {"tokens_per_s", w.spec_tokens_per_s},
                   {"mean_accepted", w.spec_mean_accepted},
                   {"step_ms", w.spec_step_ms},
                   {"draft_ms", w.spec_draft_ms},
                   {"verify_ms", w.spec_verify_ms}};
    if (r.full.layers > 0) {
      x["full"] = {{"layers", r.full.layers},
                   {"step_ms", w.full_step_ms},
                   {"tokens_per_s", w.full_tokens_per_s},
                   {"floor_ms", w.full_floor_ms},
                   {"tp2",
                    {{"node_bytes", w.tp2.node_bytes},
                     {"memory_ms", w.tp2.memory_s * 1e3},
                     {"allreduces", w.tp2.allreduces},
                     {"allreduce_bytes", w.tp2.allreduce_bytes},
                     {"allreduce_ms", w.tp2.allreduce_s * 1e3},
                     {"step_ms", w.tp2_step_ms},
                     {"step_ms_at_measured_efficiency", w.tp2_at_measured_ms},
                     {"node_bandwidth", o.tp.node_bandwidth},
                     {"link_bandwidth", o.tp.link_bandwidth},
                     {"allreduce_latency_s", o.tp.latency_s}}}};
      if (w.by_kind) x["full"]["by_kind"] = kinds_json(w.layer_ms, w.rest_ms, *w.by_kind);
    }
    rows.push_back(x);
  }
  j["rows"] = rows;
  return j.dump(1);
}

std::string format_prefill(const PrefillReport& r) {
  const BenchCommon& o = r.opts.common;
  std::string s = fmt::format("bench prefill: {} ({} layers) on {}; one sequence per run; kernel times: {}\n",
                              r.model_dir, r.layers, r.device, r.profile_note);
  s += fmt::format("MoE GEMM rate vs dense bf16 peak {:.0f} TFLOP/s\n", o.bf16_peak / 1e12);
  s += fmt::format("{:>8} {:>7} {:>10} {:>10} {:>14} {:>16} {:>14} {:>12} {:>14}\n", "tokens", "chunk", "seconds",
                   "tokens/s", "MoE TFLOP", "MoE TFLOP/s wall", "routed GEMM s", "routed TF/s", "% bf16 peak");
  for (const PrefillRow& w : r.rows) {
    const bool k = w.routed_gemm_s > 0;
    s += fmt::format("{:>8} {:>7} {:>10.3f} {:>10.1f} {:>14.2f} {:>16.2f} {:>14} {:>12} {:>14}\n", w.tokens, w.chunk,
                     w.seconds, w.tokens_per_s, w.moe_flops / 1e12, w.moe_flops_per_s_wall / 1e12,
                     k ? fmt::format("{:.3f}", w.routed_gemm_s) : "-",
                     k ? fmt::format("{:.2f}", w.routed_flops_per_s / 1e12) : "-",
                     k ? fmt::format("{:.2f}%", w.routed_pct_of_peak) : "-");
  }
  for (const PrefillRow& w : r.rows) {
    if (!w.counts || !w.counts->has_activity) continue;
    s += fmt::format("kernels, {} tokens: GPU busy {:.3f} s of {:.3f} s ({:.0f} %), {} launches, {} host syncs\n",
                     w.tokens, w.counts->busy_ns * 1e-9, w.seconds, 100.0 * w.counts->busy_ns * 1e-9 / w.seconds,
                     w.counts->launches, w.counts->syncs);
    s += kernel_lines(*w.counts, w.counts->busy_ns * 1e-6, 8, "busy");
  }
  if (r.full.layers > 0)
    for (const PrefillRow& w : r.rows) {
      s += fmt::format("extrapolated to {} layers: {} tokens at {:.1f} tokens/s\n", r.full.layers, w.tokens,
                       w.full_tokens_per_s);
      if (w.by_kind)
        s += kind_lines(w.layer_ms, w.rest_ms, *w.by_kind,
                        fmt::format("one {}-token pass", std::min(w.tokens, w.chunk)));
    }
  return s;
}

std::string prefill_json(const PrefillReport& r) {
  Json j;
  j["bench"] = "prefill";
  j["model"] = r.model_dir;
  j["device"] = r.device;
  j["layers"] = r.layers;
  j["bf16_peak"] = r.opts.common.bf16_peak;
  j["profile"] = r.profile_note;
  Json rows = Json::array();
  for (const PrefillRow& w : r.rows) {
    Json x;
    x["tokens"] = w.tokens;
    x["chunk"] = w.chunk;
    x["seconds"] = w.seconds;
    x["tokens_per_s"] = w.tokens_per_s;
    x["moe_flops"] = w.moe_flops;
    x["routed_flops"] = w.routed_flops;
    x["moe_flops_per_s_wall"] = w.moe_flops_per_s_wall;
    x["routed_gemm_s"] = w.routed_gemm_s;
    x["routed_flops_per_s"] = w.routed_flops_per_s;
    x["routed_pct_of_bf16_peak"] = w.routed_pct_of_peak;
    if (w.counts) x["counts"] = counts_json(*w.counts, 1, w.tokens, 16);
    if (r.full.layers > 0) {
      x["full"] = {{"layers", r.full.layers}, {"tokens_per_s", w.full_tokens_per_s}};
      if (w.by_kind) x["full"]["by_kind"] = kinds_json(w.layer_ms, w.rest_ms, *w.by_kind);
    }
    rows.push_back(x);
  }
  j["rows"] = rows;
  return j.dump(1);
}

}  // namespace dsv41::bench
