// `dsv41-serve bench decode|prefill` measurements (model_bench.h): loading the backend, filling
// sequence states, the timed steps, the profiled pass, the floor and the extrapolation.
#include "bench/model_bench.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <span>

#include "dsv41/common/error.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/spec/cuda_backend.h"
#include "bench/spec_accept.h"

#if DSV41_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace dsv41::bench {
namespace {

using Clock = std::chrono::steady_clock;
using spec::Draft;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The median time of each layer over `reps` runs of `pass` with the CUDA model's layer timing on
// (empty on the CPU engine or when a pass timed no layer).
std::vector<double> timed_layers(model::CudaModel* cuda, int64_t reps, const std::function<void()>& pass) {
  if (!cuda) return {};
  std::vector<std::vector<double>> runs;
  cuda->set_layer_timing(true);
  for (int64_t i = 0; i < reps; ++i) {
    pass();
    std::vector<double> t = cuda->layer_times_ms();
    if (!t.empty()) runs.push_back(std::move(t));
  }
  cuda->set_layer_timing(false);
  if (runs.empty()) return {};
  std::vector<double> med(runs.front().size());
  for (size_t L = 0; L < med.size(); ++L) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r[L]);
    med[L] = median(v);
  }
  return med;
}

// The backend under test: the CUDA model, or the CPU reference engine (smoke tests, tiny models).
struct Backend {
  std::unique_ptr<model::CudaModel> cuda;
  std::unique_ptr<model::CpuModel> cpu;
  std::string device_name;

  Model& model() { return cuda ? static_cast<Model&>(*cuda) : static_cast<Model&>(*cpu); }
  const ModelConfig& config() { return model().config(); }

  // A state holding `context` tokens. CUDA: random contents (bench_fill_state); CPU: a real
  // prefill of random tokens (the CPU engine is only benchmarked on tiny models).
  std::unique_ptr<SeqState> filled_sequence(int64_t context, uint64_t seed) {
    auto st = model().new_sequence();
    if (context == 0) return st;
    if (cuda) {
      cuda->bench_fill_state(*st, context, seed);
    } else {
      std::vector<int32_t> toks = random_tokens(context, seed);
      st->prompt_len = context;
      cpu->forward_sequence(*st, toks, false, nullptr);
    }
    return st;
  }

  std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
    const ModelConfig& c = config();
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& v : t) {
      v = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
      if (c.vision.enabled() && v == c.image_token_id) v = 0;
    }
    return t;
  }
};

Backend load_backend(const BenchCommon& o, int64_t max_context, int64_t chunk, bool dspark) {
  Backend b;
  DSV_CHECK(o.device == "cuda" || o.device == "cpu", "--device {}: expected cpu or cuda", o.device);
  if (o.device == "cuda") {
    model::CudaModelOptions co;
    co.engram_token_map = o.engram_token_map;
    co.max_context = max_context;
    co.dspark = dspark;
    if (chunk > 0) co.max_chunk_tokens = chunk;
    b.cuda = model::CudaModel::load(o.model_dir, co);
#if DSV41_HAS_CUDA
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) b.device_name = p.name;
#endif
    const model::CudaMemoryBreakdown m = b.cuda->memory();
    spdlog::info("bench: device memory: weights {:.2f} GiB, state {:.1f} MiB per sequence of {} tokens, scratch {:.1f} MiB",
                 m.weights / 1073741824.0, m.state_per_sequence / 1048576.0, b.cuda->max_context(),
                 m.scratch / 1048576.0);
  } else {
    model::CpuModelOptions mo;
    mo.engram_token_map = o.engram_token_map;
    mo.dspark = false;
    b.cpu = model::CpuModel::load(o.model_dir, mo);
    b.device_name = "CPU reference engine";
  }
  return b;
}

void check_context(const ModelConfig& c, int64_t needed, const char* what) {
  DSV_CHECK(needed <= c.max_position_embeddings, "{}: {} tokens exceed the model's max_position_embeddings = {}", what,
            needed, c.max_position_embeddings);
}

std::unique_ptr<KernelProfiler> make_profiler(const BenchCommon& o, const Backend& b, std::string* note) {
  if (!o.profile) {
    *note = "profiling off (--no-profile)";
    return nullptr;
  }
  if (!b.cuda) {
    *note = "launch counts need --device cuda";
    return nullptr;
  }
  std::string why;
  auto p = KernelProfiler::create(&why);
  *note = p ? "CUPTI" : "no launch counts: " + why;
  return p;
}

// Speculative decode steps of `batch` sequences at `context`: the real DSpark drafts and verify
// forwards of the CUDA backend, then a rollback to the accepted prefix, whose length is drawn at
// the stand-in acceptance rate (a random-weight model's drafts are never right).
void run_spec(Backend& be, const DecodeOptions& o, double rate, int64_t batch, int64_t context, DecodeRow& row) {
  DSV_CHECK(be.cuda && be.cuda->has_dspark(), "--spec-tokens: the checkpoint has no DSpark (mtp.*) stages");
  auto sb = spec::make_cuda_spec_backend(*be.cuda);
  const int64_t k = std::min(o.spec_tokens, sb->block_size());
  std::vector<std::unique_ptr<SeqState>> states;
  for (int64_t i = 0; i < batch; ++i)
    states.push_back(be.filled_sequence(context, o.common.seed * 7919u + static_cast<uint64_t>(i)));
  std::vector<int32_t> anchors = be.random_tokens(batch, o.common.seed + 11);
  {  // one plain decode step per sequence: the drafter reads the taps of the last fed position
    std::vector<ForwardItem> items(static_cast<size_t>(batch));
    std::vector<int32_t> first = be.random_tokens(batch, o.common.seed + 13);
    for (int64_t i = 0; i < batch; ++i)
      items[static_cast<size_t>(i)] = {states[static_cast<size_t>(i)].get(),
                                       std::span<const int32_t>(&first[static_cast<size_t>(i)], 1), false, nullptr};
    be.model().forward(items);
  }
  std::mt19937_64 rng(o.common.seed + 17);
  double total_s = 0, draft_s = 0, verify_s = 0;
  int64_t produced = 0, accepted = 0, timed = 0;
  std::vector<Draft> drafts(static_cast<size_t>(batch));
  std::vector<std::vector<int32_t>> toks(static_cast<size_t>(batch));
  std::vector<std::vector<float>> logits(static_cast<size_t>(batch));
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    const auto t0 = Clock::now();
    std::vector<spec::DraftItem> di(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i)
      di[static_cast<size_t>(i)] = {states[static_cast<size_t>(i)].get(), anchors[static_cast<size_t>(i)],
                                    &drafts[static_cast<size_t>(i)]};
    sb->draft(di);
    const double d_s = sb->last_draft_seconds();
    std::vector<ForwardItem> items(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      const auto& ids = drafts[static_cast<size_t>(i)].ids;
      DSV_CHECK(static_cast<int64_t>(ids.size()) >= k + 1, "draft: {} ids for {} drafts", ids.size(), k);
      toks[static_cast<size_t>(i)].assign(ids.begin(), ids.begin() + k + 1);  // the anchor, then k drafts
      items[static_cast<size_t>(i)] = {states[static_cast<size_t>(i)].get(), toks[static_cast<size_t>(i)], true,
                                       &logits[static_cast<size_t>(i)]};
    }
    const std::vector<uint8_t> verify(static_cast<size_t>(batch), 1);
    sb->forward(items, verify);
    const double v_s = sb->last_forward_seconds();
    int64_t step_tokens = 0, step_acc = 0;
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t a = simulate_accepted(rate, k, rng);
      sb->rollback(*states[static_cast<size_t>(i)], 1 + a);
      step_tokens += 1 + a;  // the accepted drafts and the target's token after them
      step_acc += a;
    }
    anchors = be.random_tokens(batch, o.common.seed + 101 + static_cast<uint64_t>(s));
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s >= o.warmup) {
      total_s += step_s;
      draft_s += d_s;
      verify_s += v_s;
      produced += step_tokens;
      accepted += step_acc;
      ++timed;
    }
  }
  for (auto& st : states) sb->release(*st);
  row.has_spec = true;
  row.spec_k = k;
  row.spec_tokens_per_s = static_cast<double>(produced) / total_s;
  row.spec_mean_accepted = static_cast<double>(accepted) / static_cast<double>(timed * batch);
  row.spec_step_ms = total_s * 1e3 / static_cast<double>(timed);
  row.spec_draft_ms = draft_s * 1e3 / static_cast<double>(timed);
  row.spec_verify_ms = verify_s * 1e3 / static_cast<double>(timed);
}

}  // namespace

std::vector<int64_t> parse_positive_list(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  DSV_CHECK(!text.empty(), "{}: empty list (expected comma-separated positive integers, e.g. 1,2,4)", flag);
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    DSV_CHECK(!item.empty() && item.size() <= 12 && item.find_first_not_of("0123456789") == std::string::npos,
              "{}: '{}' is not a positive integer (expected comma-separated positive integers, e.g. 1,2,4)", flag,
              item);
    const int64_t v = std::stoll(item);
    DSV_CHECK(v > 0, "{}: '{}' is not a positive integer (expected comma-separated positive integers, e.g. 1,2,4)", flag,
              item);
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

FullModel resolve_full_model(const BenchCommon& c, const ModelConfig& loaded) {
  FullModel f;
  DSV_CHECK(c.layers_total >= 0, "--layers-total must be positive, got {}", c.layers_total);
  if (!c.full_config.empty()) {
    f.cfg = load_model_config(c.full_config);
    f.from_config = true;
    f.layers = f.cfg.num_hidden_layers;
    DSV_CHECK(c.layers_total == 0 || c.layers_total == f.layers,
              "--layers-total {} disagrees with --full-config {} (num_hidden_layers = {})", c.layers_total,
              c.full_config, f.layers);
    DSV_CHECK(f.cfg.hidden_size == loaded.hidden_size && f.cfg.n_routed_experts == loaded.n_routed_experts &&
                  f.cfg.vocab_size == loaded.vocab_size,
              "--full-config {}: dimensions differ from the benchmarked model (hidden {} vs {}, experts {} vs {}, "
              "vocab {} vs {})",
              c.full_config, f.cfg.hidden_size, loaded.hidden_size, f.cfg.n_routed_experts, loaded.n_routed_experts,
              f.cfg.vocab_size, loaded.vocab_size);
    f.tensors = manifest_tensor_sizes(f.cfg);
    f.weights = classify_weights(f.cfg, f.tensors);
  } else if (c.layers_total > 0) {
    f.layers = c.layers_total;
  }
  return f;
}

DecodeReport run_decode_bench(const DecodeOptions& o) {
  DSV_CHECK(o.steps >= 1, "--steps must be at least 1, got {}", o.steps);
  DSV_CHECK(o.warmup >= 0, "--warmup must not be negative, got {}", o.warmup);
  DSV_CHECK(!o.batches.empty() && !o.contexts.empty(), "bench decode: --batch and --context need values");
  const int64_t max_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  const int64_t profiled = std::min<int64_t>(o.steps, 4);
  DSV_CHECK(o.spec_tokens >= 0, "--spec-tokens must not be negative, got {}", o.spec_tokens);
  DSV_CHECK(o.spec_tokens == 0 || o.common.device == "cuda",
            "--spec-tokens: the speculation benchmark runs on --device cuda (CPU: tests/bench/bench_spec)");
  const int64_t spec_room = o.spec_tokens > 0 ? (o.warmup + o.steps + 2) * (o.spec_tokens + 1) : 0;
  // Steps per sequence: warm-up, timed with and without the head, timed in the other graph mode,
  // timed layer by layer, profiled.
  const int64_t room = max_ctx + std::max(o.warmup + 4 * o.steps + profiled + 2, spec_room);

  Backend be = load_backend(o.common, room, 0, o.common.dspark || o.spec_tokens > 0);
  const ModelConfig& cfg = be.config();
  check_context(cfg, room, "bench decode: --context + --warmup + steps");
  auto ckpt = Checkpoint::open(o.common.model_dir);
  const TensorSizes tensors = checkpoint_tensor_sizes(*ckpt);
  const ModelWeights weights = classify_weights(cfg, tensors);

  DecodeReport r;
  r.device = be.device_name;
  r.model_dir = o.common.model_dir;
  r.layers = cfg.num_hidden_layers;
  r.opts = o;
  r.full = resolve_full_model(o.common, cfg);
  auto prof = make_profiler(o.common, be, &r.profile_note);
  const double L = static_cast<double>(cfg.num_hidden_layers);
  if (o.spec_tokens > 0) {
    if (o.spec_accept >= 0) {
      DSV_CHECK(o.spec_accept <= 1, "--spec-accept {} outside 0..1", o.spec_accept);
      r.spec_rate = o.spec_accept;
      r.spec_rate_source = "--spec-accept";
    } else {
      DSV_CHECK(!o.spec_accept_files.empty(), "--spec-tokens needs --spec-accept RATE or --spec-accept-from FILES");
      const Acceptance a = measure_acceptance(o.spec_accept_files);
      r.spec_rate = a.rate();
      r.spec_rate_source = fmt::format("{} of {} drafts accepted in {} draft blocks of {} golden file(s)", a.accepted,
                                       a.tried, a.rows, o.spec_accept_files.size());
    }
  }

  for (int64_t context : o.contexts) {
    for (int64_t batch : o.batches) {
      spdlog::info("bench decode: batch {} context {}", batch, context);
      std::vector<std::unique_ptr<SeqState>> states;
      for (int64_t i = 0; i < batch; ++i)
        states.push_back(be.filled_sequence(context, o.common.seed * 1000003u + static_cast<uint64_t>(i)));
      const std::vector<int32_t> toks =
          be.random_tokens(batch * (o.warmup + 4 * o.steps + profiled + 1), o.common.seed);
      size_t next_tok = 0;
      std::vector<std::vector<float>> logits(static_cast<size_t>(batch));
      auto step = [&](bool with_logits) {
        std::vector<ForwardItem> items(static_cast<size_t>(batch));
        for (int64_t i = 0; i < batch; ++i) {
          ForwardItem& it = items[static_cast<size_t>(i)];
          it.state = states[static_cast<size_t>(i)].get();
          it.tokens = std::span<const int32_t>(&toks[next_tok++], 1);
          it.logits = with_logits ? &logits[static_cast<size_t>(i)] : nullptr;
        }
        const auto t0 = Clock::now();
        be.model().forward(items);
        return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      };
      for (int64_t i = 0; i < o.warmup; ++i) step(true);
      std::vector<double> with, without;
      for (int64_t i = 0; i < o.steps; ++i) with.push_back(step(true));
      for (int64_t i = 0; i < o.steps; ++i) without.push_back(step(false));
      // The same steps in the other decode mode (CUDA graphs on or off), after one untimed step in
      // that mode (it builds the graph executables, or leaves them).
      const bool graphs = be.cuda && be.cuda->cuda_graphs();
      const bool both_modes = be.cuda && be.cuda->cuda_graphs_available();
      std::vector<double> other;
      if (both_modes) {
        be.cuda->set_cuda_graphs(!graphs);
        step(true);
        for (int64_t i = 0; i < o.steps; ++i) other.push_back(step(true));
        be.cuda->set_cuda_graphs(graphs);
      }

      DecodeRow row;
      row.batch = batch;
      row.context = context;
      row.step_ms = median(with);
      row.step_ms_min = *std::min_element(with.begin(), with.end());
      row.step_ms_no_head = median(without);
      row.cuda_graphs = graphs;
      if (both_modes) {
        row.step_ms_graphs = graphs ? row.step_ms : median(other);
        row.step_ms_no_graphs = graphs ? median(other) : row.step_ms;
      }
      row.ms_per_layer = row.step_ms_no_head / L;
      row.ms_per_layer_token = row.ms_per_layer / static_cast<double>(batch);
      row.tokens_per_s = static_cast<double>(batch) * 1e3 / row.step_ms;
      if (prof) {
        prof->start();
        for (int64_t i = 0; i < profiled; ++i) step(true);
        row.counts = prof->stop();
        row.profiled_steps = profiled;
      }
      row.floor = decode_step_bytes(cfg, weights, batch, context);
      row.floor_ms = row.floor.total() / o.common.copy_bandwidth * 1e3;
      row.roofline_pct = 100.0 * row.floor_ms / row.step_ms;

      if (r.full.layers > 0) {
        const double head_ms = std::max(0.0, row.step_ms - row.step_ms_no_head);
        const double scale = static_cast<double>(r.full.layers) / L;
        row.full_step_ms = row.ms_per_layer * static_cast<double>(r.full.layers) + head_ms;
        if (r.full.from_config) {  // each layer timed, then the full model's layers by kind
          std::vector<double> walls;
          row.layer_ms = timed_layers(be.cuda.get(), o.steps, [&] { walls.push_back(step(false)); });
          double sum = 0;
          for (double t : row.layer_ms) sum += t;
          if (sum > 0) {
            // What the step spends outside its layers (embedding, uploads, launches) does not grow
            // with the layer count.
            row.rest_ms = std::max(0.0, median(walls) - sum);
            row.by_kind = extrapolate_layers(cfg, row.layer_ms, r.full.cfg);
            row.full_step_ms = row.by_kind->total_ms + row.rest_ms + head_ms;
          }
        }
        row.full_tokens_per_s = static_cast<double>(batch) * 1e3 / row.full_step_ms;
        TpProjection tp;
        if (r.full.from_config) {
          row.full_floor_ms =
              decode_step_bytes(r.full.cfg, r.full.weights, batch, context).total() / o.common.copy_bandwidth * 1e3;
          tp = project_tp2(r.full.cfg, r.full.tensors, r.full.weights, batch, context, o.common.tp);
        } else {
          row.full_floor_ms = (row.floor.layers_total() * scale + row.floor.head + row.floor.embed_norm) /
                              o.common.copy_bandwidth * 1e3;
          // The loaded model's projection with its per-layer part scaled to the full layer count.
          tp = project_tp2(cfg, tensors, weights, batch, context, o.common.tp);
          const double global = row.floor.head / 2 + row.floor.embed_norm;
          tp.node_bytes = (tp.node_bytes - global) * scale + global;
          tp.memory_s = tp.node_bytes / o.common.tp.node_bandwidth;
          tp.scale_layers(scale, o.common.tp);
        }
        row.tp2 = tp;
        row.tp2_step_ms = tp.step_s() * 1e3;
        // The same memory efficiency as measured here (measured / floor) on each node.
        row.tp2_at_measured_ms = (tp.memory_s * (row.step_ms / row.floor_ms) + tp.allreduce_s) * 1e3;
      }
      if (o.spec_tokens > 0) run_spec(be, o, r.spec_rate, batch, context, row);
      spdlog::info("bench decode: batch {} context {}: {:.3f} ms/step ({:.3f} without head; CUDA graphs {:.3f}, eager "
                   "{:.3f}), floor {:.4f} ms",
                   batch, context, row.step_ms, row.step_ms_no_head, row.step_ms_graphs, row.step_ms_no_graphs,
                   row.floor_ms);
      if (be.cuda) {
        const model::CudaGraphStats g = be.cuda->graph_stats();
        spdlog::info("bench decode: CUDA graphs so far: {} steps, {} launches, {} executable updates, {} instantiations; "
                     "host ms per step: capture {:.3f}, update {:.3f}, instantiate {:.3f}, launch {:.3f}",
                     g.steps, g.graph_launches, g.updates, g.instantiations, g.capture_ms / std::max<int64_t>(1, g.steps),
                     g.update_ms / std::max<int64_t>(1, g.steps), g.instantiate_ms / std::max<int64_t>(1, g.steps),
                     g.launch_ms / std::max<int64_t>(1, g.steps));
      }
      r.rows.push_back(row);
    }
  }
  return r;
}

PrefillReport run_prefill_bench(const PrefillOptions& o) {
  DSV_CHECK(!o.tokens.empty(), "bench prefill: --tokens needs values");
  DSV_CHECK(o.chunk >= 0, "--chunk must not be negative, got {}", o.chunk);
  const int64_t max_n = *std::max_element(o.tokens.begin(), o.tokens.end());
  Backend be = load_backend(o.common, max_n, o.chunk, o.common.dspark);
  const ModelConfig& cfg = be.config();
  check_context(cfg, max_n, "bench prefill: --tokens");

  PrefillReport r;
  r.device = be.device_name;
  r.model_dir = o.common.model_dir;
  r.layers = cfg.num_hidden_layers;
  r.opts = o;
  r.full = resolve_full_model(o.common, cfg);
  auto prof = make_profiler(o.common, be, &r.profile_note);
  const double L = static_cast<double>(cfg.num_hidden_layers);
  const double dim = static_cast<double>(cfg.hidden_size), inter = static_cast<double>(cfg.moe_intermediate_size);

  auto run = [&](int64_t n, uint64_t seed) {
    auto st = be.model().new_sequence();
    st->prompt_len = n;
    const std::vector<int32_t> toks = be.random_tokens(n, seed);
    std::vector<float> logits;
    std::vector<ForwardItem> items(1);
    items[0].state = st.get();
    items[0].tokens = toks;
    items[0].logits = &logits;
    const auto t0 = Clock::now();
    be.model().forward(items);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // Warm-up: first-call costs (kernel loading, page faults of the host buffers) outside the timing.
  run(std::min<int64_t>(max_n, 512), o.common.seed + 7);

  for (int64_t n : o.tokens) {
    spdlog::info("bench prefill: {} tokens", n);
    PrefillRow row;
    row.tokens = n;
    // CUDA: passes of the scratch arena's size; CPU: one pass.
    row.chunk = be.cuda ? (o.chunk > 0 ? o.chunk : model::CudaModelOptions{}.max_chunk_tokens) : n;
    if (prof) prof->start();
    row.seconds = run(n, o.common.seed + static_cast<uint64_t>(n));
    if (prof) row.counts = prof->stop();
    row.tokens_per_s = static_cast<double>(n) / row.seconds;
    const double N = static_cast<double>(n);
    row.routed_flops = 2.0 * N * static_cast<double>(cfg.num_experts_per_tok) * 3.0 * dim * inter * L;
    row.moe_flops = row.routed_flops + 2.0 * N * static_cast<double>(cfg.n_shared_experts) * 3.0 * dim * inter * L;
    row.moe_flops_per_s_wall = row.moe_flops / row.seconds;
    if (row.counts && row.counts->has_activity) {
      for (const KernelStat& k : row.counts->kernels) {
        const bool routed = k.name.find("lin4") != std::string::npos ||
                            (k.name.find("moe") != std::string::npos && k.name.find("combine") == std::string::npos);
        if (routed) row.routed_gemm_s += k.total_ns * 1e-9;
      }
      if (row.routed_gemm_s > 0) {
        row.routed_flops_per_s = row.routed_flops / row.routed_gemm_s;
        row.routed_pct_of_peak = 100.0 * row.routed_flops_per_s / o.common.bf16_peak;
      }
    }
    spdlog::info("bench prefill: {} tokens in {:.3f} s ({:.1f} tokens/s), routed GEMM kernels {:.3f} s", n, row.seconds,
                 row.tokens_per_s, row.routed_gemm_s);
    if (r.full.layers > 0) {
      row.full_tokens_per_s = row.tokens_per_s * L / static_cast<double>(r.full.layers);
      if (r.full.from_config) {  // one pass timed layer by layer: the full model's layers by kind
        double pass_ms = 0;
        row.layer_ms =
            timed_layers(be.cuda.get(), 1, [&] { pass_ms = 1e3 * run(std::min(n, row.chunk), o.common.seed + 11); });
        double sum = 0;
        for (double t : row.layer_ms) sum += t;
        if (sum > 0) {
          // The pass's time outside its layers (embedding, the last row's head) stays as it is.
          row.rest_ms = std::max(0.0, pass_ms - sum);
          row.by_kind = extrapolate_layers(cfg, row.layer_ms, r.full.cfg);
          row.full_tokens_per_s = row.tokens_per_s * pass_ms / (row.by_kind->total_ms + row.rest_ms);
        }
      }
    }
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace dsv41::bench
