// `dsv41-serve bench decode|prefill`: decode-step and prefill timings of a checkpoint (the CUDA
// backend; the CPU reference engine for smoke tests on tiny models), against the bytes floor and
// the tensor-core peak, extrapolated to the full layer count and projected to two nodes (TP2).
// Measurements: src/bench/model_bench.cpp; what the floor counts: src/bench/bytes_floor.h.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fstream>

#include "bench/model_bench.h"
#include "cli/commands.h"
#include "dsv41/common/error.h"

namespace dsv41::cli {
namespace {

struct BenchArgs {
  bench::BenchCommon common;
  double copy_gbs = 4300, peak_tflops = 989, node_gbs = 232, link_gbps = 200, latency_us = 15;
  bool no_profile = false;
  // decode
  std::string batches = "1,2,4", contexts = "4096,131072";
  int64_t steps = 16, warmup = 3;
  int64_t spec_tokens = 0;
  double spec_accept = -1.0;
  std::string spec_accept_from;
  // prefill
  std::string tokens = "8192,32768";
  int64_t chunk = 0;
};

void add_common(CLI::App* app, BenchArgs& a) {
  app->add_option("--model", a.common.model_dir, "Checkpoint folder (e.g. made by mkmodel with the real dimensions)")
      ->required();
  app->add_option("--device", a.common.device, "cuda or cpu (the CPU reference engine: tiny models only)")
      ->capture_default_str();
  app->add_option("--engram-token-map", a.common.engram_token_map,
                  "safetensors file with an int32 token_map (needed when the model has Engram layers)");
  app->add_option("--layers-total", a.common.layers_total,
                  "Extrapolate to this many layers (default: num_hidden_layers of --full-config; none without either)");
  app->add_option("--full-config", a.common.full_config,
                  "config.json of the full model (e.g. configs/deepseek-v4.1-flash.json): its layer count and the "
                  "bytes of each layer role for the extrapolation");
  app->add_option("--json", a.common.json_out, "Write the raw numbers to this JSON file");
  app->add_option("--copy-bandwidth-gbs", a.copy_gbs, "Copy ceiling in GB/s for the bytes floor (H200: 4300)")
      ->capture_default_str();
  app->add_option("--node-bandwidth-gbs", a.node_gbs, "TP2 projection: memory bandwidth of one node in GB/s (GB10)")
      ->capture_default_str();
  app->add_option("--link-gbps", a.link_gbps, "TP2 projection: node-to-node link in Gb/s (ConnectX-7: 200)")
      ->capture_default_str();
  app->add_option("--allreduce-latency-us", a.latency_us,
                  "TP2 projection: fixed cost of one all-reduce in microseconds (assumed, not measured)")
      ->capture_default_str();
  app->add_flag("--no-profile", a.no_profile, "Skip the CUPTI pass (launch counts, kernel times)");
  app->add_flag("--dspark", a.common.dspark,
                "Load the DSpark stages: every pass also feeds their taps and rings, as with --spec-method dspark "
                "(--spec-tokens loads them anyway)");
  app->add_option("--seed", a.common.seed, "Seed of the random tokens and state contents")->capture_default_str();
}

bench::BenchCommon finish_common(const BenchArgs& a) {
  DSV_CHECK(a.copy_gbs > 0 && a.peak_tflops > 0 && a.node_gbs > 0 && a.link_gbps > 0 && a.latency_us >= 0,
            "bench: bandwidths and peaks must be positive (--copy-bandwidth-gbs, --bf16-peak-tflops, "
            "--node-bandwidth-gbs, --link-gbps), the all-reduce latency not negative");
  bench::BenchCommon c = a.common;
  c.copy_bandwidth = a.copy_gbs * 1e9;
  c.bf16_peak = a.peak_tflops * 1e12;
  c.tp.node_bandwidth = a.node_gbs * 1e9;
  c.tp.link_bandwidth = a.link_gbps * 1e9 / 8;
  c.tp.latency_s = a.latency_us * 1e-6;
  c.profile = !a.no_profile;
  return c;
}

void write_json(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::ofstream f(path);
  DSV_CHECK(f.good(), "--json {}: cannot open for writing", path);
  f << text << "\n";
  DSV_CHECK(f.good(), "--json {}: write failed", path);
  spdlog::info("bench: wrote {}", path);
}

int run_decode(const BenchArgs& a) {
  bench::DecodeOptions o;
  o.common = finish_common(a);
  o.batches = bench::parse_positive_list(a.batches, "--batch");
  o.contexts = bench::parse_positive_list(a.contexts, "--context");
  o.steps = a.steps;
  o.warmup = a.warmup;
  o.spec_tokens = a.spec_tokens;
  o.spec_accept = a.spec_accept;
  if (!a.spec_accept_from.empty()) {
    size_t pos = 0;
    while (pos <= a.spec_accept_from.size()) {
      const size_t comma = a.spec_accept_from.find(',', pos);
      const std::string f = a.spec_accept_from.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      DSV_CHECK(!f.empty(), "--spec-accept-from: empty file name in '{}'", a.spec_accept_from);
      o.spec_accept_files.push_back(f);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  const bench::DecodeReport r = bench::run_decode_bench(o);
  fmt::print("{}", bench::format_decode(r));
  write_json(o.common.json_out, bench::decode_json(r));
  return 0;
}

int run_prefill(const BenchArgs& a) {
  bench::PrefillOptions o;
  o.common = finish_common(a);
  o.tokens = bench::parse_positive_list(a.tokens, "--tokens");
  o.chunk = a.chunk;
  const bench::PrefillReport r = bench::run_prefill_bench(o);
  fmt::print("{}", bench::format_prefill(r));
  write_json(o.common.json_out, bench::prefill_json(r));
  return 0;
}

}  // namespace

Command add_bench(CLI::App& root) {
  auto d = std::make_shared<BenchArgs>();
  auto p = std::make_shared<BenchArgs>();
#if DSV41_HAS_CUDA
  d->common.device = p->common.device = "cuda";
#else
  d->common.device = p->common.device = "cpu";
#endif
  CLI::App* app = root.add_subcommand("bench", "Benchmark decode steps or prefill of a checkpoint (bytes floor, "
                                               "launch counts, extrapolation to the full model, TP2 projection)");
  app->require_subcommand(0, 1);  // none: the run function names the two (an unknown word is an extra)
  CLI::App* dec = app->add_subcommand(
      "decode",
      "Timed one-token decode steps of --batch sequences whose state already holds --context tokens (CUDA: random "
      "state contents of the right types; CPU: a real prefill); ms per step and per layer, tokens/s, kernel launches "
      "per token, bytes floor and % of roofline");
  add_common(dec, *d);
  dec->add_option("--batch", d->batches, "Batch sizes, comma separated")->capture_default_str();
  dec->add_option("--context", d->contexts, "Context lengths (tokens already in each sequence), comma separated")
      ->capture_default_str();
  dec->add_option("--steps", d->steps, "Timed steps per (batch, context); the same count again without the head")
      ->capture_default_str();
  dec->add_option("--warmup", d->warmup, "Untimed steps first")->capture_default_str();
  dec->add_option("--spec-tokens", d->spec_tokens,
                  "Also run DSpark speculation with K drafts per verify step (CUDA; real drafts and verify forwards, "
                  "accepted prefix drawn at the --spec-accept rate); 0 = off")
      ->capture_default_str();
  dec->add_option("--spec-accept", d->spec_accept, "Acceptance rate per draft (0..1) for --spec-tokens");
  dec->add_option("--spec-accept-from", d->spec_accept_from,
                  "Golden files with dspark_draft_ids and greedy_ids (comma separated, e.g. "
                  "tests/fixtures/tiny-s0/golden.safetensors): measure the --spec-tokens acceptance rate there");
  CLI::App* pre = app->add_subcommand(
      "prefill", "Prefill of one sequence of N random tokens (in passes of --chunk tokens on CUDA): tokens/s and the "
                 "MoE GEMM rate against the dense bf16 tensor peak");
  add_common(pre, *p);
  pre->add_option("--tokens", p->tokens, "Prompt lengths, comma separated")->capture_default_str();
  pre->add_option("--chunk", p->chunk, "CUDA: tokens per forward pass (scratch size); 0 = the backend's default");
  pre->add_option("--bf16-peak-tflops", p->peak_tflops, "Dense bf16 tensor peak in TFLOP/s (H200 spec: 989)")
      ->capture_default_str();
  return Command{app, [d, p, dec, pre] {
                   if (dec->parsed()) return run_decode(*d);
                   if (pre->parsed()) return run_prefill(*p);
                   fail("bench: expected a subcommand: decode or prefill");
                 }};
}

}  // namespace dsv41::cli
