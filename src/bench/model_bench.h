// `dsv41-serve bench decode|prefill`: decode step and prefill timings of a checkpoint on the CUDA
// backend (or the CPU reference engine, for smoke tests on tiny models), with the bytes floor,
// kernel launch counts, an extrapolation to the full layer count and a two-node TP projection.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bytes_floor.h"
#include "bench/layer_extrapolation.h"
#include "bench/kernel_profiler.h"
#include "dsv41/config/model_config.h"

namespace dsv41::bench {

// "1,2,4" -> {1, 2, 4}: positive integers, comma separated, no empty items (`flag` names the
// option in the error).
std::vector<int64_t> parse_positive_list(const std::string& text, const std::string& flag);

struct BenchCommon {
  std::string model_dir, device, engram_token_map, json_out;
  std::string full_config;     // config.json of the full model: layer count and bytes by layer role
  int64_t layers_total = 0;    // layer count to extrapolate to (0: from full_config, else none)
  double copy_bandwidth = 4.3e12;   // bytes/s, the H200 device-to-device copy ceiling
  double bf16_peak = 989e12;        // FLOP/s, H200 dense bf16 tensor peak (spec sheet)
  TpLink tp;                        // two-node projection: per-node bandwidth, link, latency
  bool profile = true;              // CUPTI launch counts / kernel times (CUDA only)
  // Load the DSpark stages (CUDA): every pass then also feeds their taps and rings, as a server
  // with --spec-method dspark does; decode's --spec-tokens loads them anyway.
  bool dspark = false;
  uint64_t seed = 1;
};

struct DecodeOptions {
  BenchCommon common;
  std::vector<int64_t> batches{1, 2, 4}, contexts{4096, 131072};
  int64_t steps = 16, warmup = 3;
  // DSpark speculation (CUDA): drafts per verify step (0 = off) and the acceptance rate to
  // simulate; rate < 0 = measured from spec_accept_files (golden files with dspark_draft_ids).
  int64_t spec_tokens = 0;
  double spec_accept = -1.0;
  std::vector<std::string> spec_accept_files;
};

struct PrefillOptions {
  BenchCommon common;
  std::vector<int64_t> tokens{8192, 32768};
  int64_t chunk = 0;  // tokens per forward pass (CUDA scratch size); 0 = the backend's default
};

// Numbers the extrapolation uses: the loaded model's and the full model's layer count and bytes.
struct FullModel {
  int64_t layers = 0;           // 0: no extrapolation
  bool from_config = false;     // bytes from the full config's manifest (else scaled per layer)
  ModelConfig cfg;              // when from_config
  TensorSizes tensors;          // when from_config
  ModelWeights weights;         // when from_config
};

struct DecodeRow {
  int64_t batch = 0, context = 0;
  double step_ms = 0;          // median wall time of a decode step (b sequences, one token each)
  double step_ms_min = 0;
  double step_ms_no_head = 0;  // median step without logits (the head is skipped)
  bool cuda_graphs = false;    // the timed steps (step_ms) ran in CUDA graphs
  double step_ms_graphs = 0;     // median step (with logits) with the decode graphs on (0: not available)
  double step_ms_no_graphs = 0;  // the same with them off (0: not available)
  double ms_per_layer = 0;     // step_ms_no_head / layers: one layer of one step
  double ms_per_layer_token = 0;  // ms_per_layer / batch
  double tokens_per_s = 0;
  StepBytes floor;             // bytes floor of the loaded model
  double floor_ms = 0, roofline_pct = 0;
  std::optional<ProfileCounts> counts;  // per profiled step (divide by batch for per token)
  int64_t profiled_steps = 0;
  // extrapolation (full.layers > 0): by layer kind when the layers were timed one by one (CUDA,
  // --full-config; layer_ms: this model's layers a step without the head, rest_ms the rest of such
  // a step, kept as it is), else the average layer x full.layers
  std::vector<double> layer_ms;
  double rest_ms = 0;
  std::optional<LayerExtrapolation> by_kind;
  double full_step_ms = 0, full_floor_ms = 0, full_tokens_per_s = 0;
  TpProjection tp2;            // full model on two nodes (floor)
  double tp2_step_ms = 0, tp2_at_measured_ms = 0;
  // speculation (spec_tokens > 0): real drafts and verify forwards, accepts simulated at the rate
  bool has_spec = false;
  int64_t spec_k = 0;
  double spec_tokens_per_s = 0, spec_mean_accepted = 0, spec_step_ms = 0, spec_draft_ms = 0, spec_verify_ms = 0;
};

struct PrefillRow {
  int64_t tokens = 0, chunk = 0;
  double seconds = 0, tokens_per_s = 0;
  double moe_flops = 0;            // routed + shared expert GEMM FLOPs of the run
  double routed_flops = 0;
  double moe_flops_per_s_wall = 0; // moe_flops / whole prefill time (a lower bound)
  std::optional<ProfileCounts> counts;
  double routed_gemm_s = 0;        // time of the routed-expert GEMM kernels (profiled runs)
  double routed_flops_per_s = 0, routed_pct_of_peak = 0;
  double full_tokens_per_s = 0;    // extrapolated to full.layers (0: none)
  // by layer kind (one pass of up to `chunk` tokens timed layer by layer; layer_ms: its layers,
  // rest_ms the rest of that pass)
  std::vector<double> layer_ms;
  double rest_ms = 0;
  std::optional<LayerExtrapolation> by_kind;
};

struct DecodeReport {
  std::string device, model_dir, profile_note;
  int64_t layers = 0;
  DecodeOptions opts;
  FullModel full;
  std::vector<DecodeRow> rows;
  double spec_rate = 0;          // acceptance rate simulated (spec_tokens > 0)
  std::string spec_rate_source;  // where it came from
};
struct PrefillReport {
  std::string device, model_dir, profile_note;
  int64_t layers = 0;
  PrefillOptions opts;
  FullModel full;
  std::vector<PrefillRow> rows;
};

DecodeReport run_decode_bench(const DecodeOptions& o);
PrefillReport run_prefill_bench(const PrefillOptions& o);

// Human tables (stdout) and the raw numbers as JSON.
std::string format_decode(const DecodeReport& r);
std::string format_prefill(const PrefillReport& r);
std::string decode_json(const DecodeReport& r);
std::string prefill_json(const PrefillReport& r);

// The full model of --full-config / --layers-total (validated against the loaded config).
FullModel resolve_full_model(const BenchCommon& c, const ModelConfig& loaded);

}  // namespace dsv41::bench
