// The bare form: `dsv41-serve --model DIR ...` serves the OpenAI-compatible API on rank 0.
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <pthread.h>

#include "cli/serve_options.h"
#include "cli/tp_options.h"
#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/engram/open.h"
#include "dsv41/engram/row_store.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/spec/cuda_backend.h"
#include "dsv41/runtime/memory_budget.h"
#include "dsv41/runtime/progress.h"
#include "dsv41/runtime/thread_dump.h"
#include "runtime/serve_startup.h"
#include "dsv41/serve/http.h"
#include "dsv41/spec/cpu_backend.h"
#include "sched/scheduler.h"
#include "serve/api.h"
#include "serve/runtime_guards.h"
#include "serve/text_backend_impl.h"

namespace dsv41::cli {

void add_serve_options(CLI::App& app, ServeOptions& o) {
  app.add_option("--rank", o.rank, "This process's rank: 0 = head (HTTP server), >0 = headless worker")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world-size", o.world_size, "Number of tensor-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--model", o.model_dir, "Checkpoint folder (config.json + *.safetensors)");
  app.add_option("--engram-dir", o.engram_dir, "Folder with the original checkpoint's Engram shards");
  app.add_option("--host", o.host, "HTTP bind address")->capture_default_str();
  app.add_option("--port", o.port, "HTTP port")->capture_default_str()->check(CLI::Range(1, 65535));
  app.add_option("--master-addr", o.master_addr, "Address of rank 0's control endpoint")->capture_default_str();
  app.add_option("--master-port", o.master_port, "Port of rank 0's control endpoint")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app.add_option("--api-key", o.api_key, "Require this bearer token (also DSV41_API_KEY)");
  app.add_option("--config", o.config_file, "Configuration file (KEY=VALUE lines); flags override it");
  app.add_option("--device", o.device, "cpu, cuda (one GPU) or auto (cuda when built with CUDA and a GPU is present)")
      ->capture_default_str();
  app.add_option("--engram-token-map", o.engram_token_map, "safetensors file with an int32 token_map");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json to use when the checkpoint folder has none");
  app.add_option("--served-model-name", o.served_model_names,
                 "Model id(s) the API answers to (default: the --model argument)");
  app.add_option("--max-num-seqs", o.max_num_seqs, "Sequences decoded together at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "Tokens per engine step at most (decode + prefill chunks)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--max-model-len", o.max_model_len, "Context length limit per request (default: the model's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-cache-gib", o.kv_cache_gib, "Memory for sequence state (KV cache), GiB")
      ->capture_default_str()
      ->check(CLI::Range(0.0001, 65536.0));
  app.add_option("--max-waiting", o.max_waiting, "Queued requests beyond which new ones get 429")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--http-threads", o.http_threads, "HTTP connection threads (a streaming request holds one)")
      ->capture_default_str()
      ->check(CLI::Range(4, 4096));
  app.add_option("--read-timeout", o.read_timeout_s, "Seconds a client may stall while sending a request")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_flag("--no-dspark", o.no_dspark,
               "Do not load the DSpark (mtp.*) stages (they are loaded only for --spec-method dspark)");
  app.add_option("--engram-packed", o.engram_packed, "Folder with Engram rows packed by pack-engram (wins over --engram-dir)");
  app.add_option("--engram-cache-gib", o.engram_cache_gib, "Engram row cache size, GiB (0 = no cache)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 65536.0));
  runtime::add_ops_options(app, o.ops);
  app.add_option("--spec-method", o.spec_method, "Speculative decoding with the checkpoint's drafter: dspark or none")
      ->capture_default_str();
  app.add_option("--spec-tokens", o.spec_tokens,
                 "Draft tokens per step at most (default and upper limit: the drafter's block size)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--spec-fixed-tokens", o.spec_fixed_tokens,
               "Always verify --spec-tokens drafts (default: adaptive length per sequence)");
  app.add_option("--spec-disable-batch-size", o.spec_disable_batch_size,
                 "Pause speculation while more than this many sequences decode in one step (0 = never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

namespace {

std::string find_tokenizer(const ServeOptions& o) {
  DSV_CHECK(std::filesystem::is_directory(o.model_dir), "--model {}: no such folder", o.model_dir);
  const std::string in_ckpt = o.model_dir + "/tokenizer.json";
  if (std::filesystem::exists(in_ckpt)) return in_ckpt;
  if (!o.tokenizer.empty()) {
    DSV_CHECK(std::filesystem::exists(o.tokenizer), "--tokenizer {}: no such file", o.tokenizer);
    return o.tokenizer;
  }
  fail("{} has no tokenizer.json: pass --tokenizer FILE (a Hugging Face tokenizer.json)", o.model_dir);
}

// Where the Engram rows come from (the same for the budget, the checkpoint and the engine).
engram::EngramStorageOptions engram_storage(const ServeOptions& o) {
  engram::EngramStorageOptions e;
  e.engram_dir = o.engram_dir;
  e.engram_packed = o.engram_packed;
  e.cache_gib = o.engram_cache_gib;
  e.rank = o.rank;
  e.world_size = o.world_size;
  return e;
}

enum class Device { cpu, cuda };
constexpr int kCudaDevice = 0;  // the CUDA engine runs on the first visible GPU (CUDA_VISIBLE_DEVICES picks it)

// Why the CUDA engine cannot serve these options ("" when it can): --device cuda refuses with it,
// --device auto falls back to the CPU engine.
std::string cuda_unsupported(const ServeOptions& o) {
  // Tensor parallelism on the CUDA backend (every rank --device cuda, NCCL): no DSpark stages yet,
  // and --device auto keeps the CPU engine there (all ranks must pick the same backend).
  if (o.world_size > 1 && o.device == "auto")
    return fmt::format("tensor parallelism (--world-size {}) uses the CUDA backend only with --device cuda on every "
                       "rank",
                       o.world_size);
  if (o.world_size > 1 && o.rank == 0 && o.spec_method == "dspark")
    return fmt::format("speculative decoding (--spec-method dspark) with tensor parallelism (--world-size {}) runs on "
                       "the CPU engine only; use --device cpu or --spec-method none",
                       o.world_size);
  std::string why;
  if (runtime::cuda_device_count(&why) == 0) return why;
  return {};
}

Device resolve_device(const ServeOptions& o) {
  if (o.device == "cpu") return Device::cpu;
  if (o.device != "cuda" && o.device != "auto") fail("--device {}: expected cpu, cuda or auto", o.device);
  const std::string why = cuda_unsupported(o);
  if (why.empty()) return Device::cuda;
  if (o.device == "cuda") fail("--device cuda: {}", why);
  spdlog::info("--device auto: using the CPU engine ({})", why);
  return Device::cpu;
}

// The CUDA engine's start-up budget: the weights, the state pool and the scratch arena all live in
// device memory, so they are checked against the device's free memory (system memory where the GPU
// shares it); on a discrete GPU the host-side Engram row cache is checked against MemAvailable.
// The weights are not pre-read: the upload reads each tensor once.
std::unique_ptr<Checkpoint> check_cuda_memory(const ServeOptions& o, const model::CudaModelOptions& mo) {
  const ModelConfig cfg = load_model_config(o.model_dir + "/config.json");
  CheckpointOpenOptions co;
  if (!o.engram_packed.empty()) co.engram_elsewhere = "--engram-packed " + o.engram_packed;
  else if (!o.engram_dir.empty()) co.engram_elsewhere = "--engram-dir " + o.engram_dir;
  auto ck = Checkpoint::open(o.model_dir, co);
  runtime::ServeMemoryPlan plan;
  plan.weight_bytes = runtime::checkpoint_weight_bytes(*ck);
  plan.world_size = o.world_size;  // rank 0 of a tensor-parallel run holds its share of the weights
  plan.kv_cache_gib = o.kv_cache_gib;
  plan.engram_cache_gib = o.engram_cache_gib;
  plan.max_num_seqs = o.max_num_seqs;
  plan.max_num_batched_tokens = o.max_num_batched_tokens;
  const runtime::CudaDeviceInfo dev = runtime::cuda_device_info(mo.device);
  const uint64_t margin = runtime::gib_to_bytes(o.ops.memory_margin_gib, "--memory-margin-gib");
  runtime::check_startup_budget(
      runtime::cuda_serve_budget_items(cfg, plan, mo.max_chunk_tokens, mo.max_context, dev.integrated),
      runtime::cuda_memory_source(mo.device), margin, o.rank);
  if (!dev.integrated && o.engram_cache_gib > 0)
    runtime::check_startup_budget(runtime::cuda_host_budget_items(plan), runtime::meminfo_source(), margin, o.rank);
  return ck;
}

}  // namespace

std::unique_ptr<Checkpoint> check_memory_and_preload(const ServeOptions& o) {
  const ModelConfig cfg = load_model_config(o.model_dir + "/config.json");
  CheckpointOpenOptions co;
  if (!o.engram_packed.empty()) co.engram_elsewhere = "--engram-packed " + o.engram_packed;
  else if (!o.engram_dir.empty()) co.engram_elsewhere = "--engram-dir " + o.engram_dir;
  auto ck = Checkpoint::open(o.model_dir, co);
  runtime::ServeMemoryPlan plan;
  plan.weight_bytes = runtime::checkpoint_weight_bytes(*ck);
  plan.world_size = o.world_size;
  plan.kv_cache_gib = o.rank == 0 ? o.kv_cache_gib : 0.0;  // the state pool lives on rank 0
  plan.engram_cache_gib = o.engram_cache_gib;
  plan.max_num_seqs = o.max_num_seqs;
  plan.max_num_batched_tokens = o.max_num_batched_tokens;
  // Unified memory (DGX Spark) and the CPU engine: MemAvailable is the truthful number.
  runtime::check_startup_budget(runtime::serve_budget_items(cfg, plan), runtime::meminfo_source(),
                                runtime::gib_to_bytes(o.ops.memory_margin_gib, "--memory-margin-gib"), o.rank);
  runtime::preload_weights(*ck);
  return ck;
}

int run_serve(const ServeOptions& o) {
  if (o.model_dir.empty()) fail("--model DIR is required (see --help)");
  if (o.rank >= o.world_size) fail("--rank {} must be below --world-size {}", o.rank, o.world_size);
  const spec::SpecMethod spec_method = spec::parse_spec_method(o.spec_method);
  const Device device = resolve_device(o);
  if (o.rank > 0) {  // headless tensor-parallel worker: no HTTP server, same start-up budget check
    check_memory_and_preload(o);
    return run_worker_rank(o);
  }

  std::string api_key = o.api_key;
  if (api_key.empty())
    if (const char* env = std::getenv("DSV41_API_KEY")) api_key = env;

  // While the checkpoint loads (minutes for the real one) the port already answers: 503 with
  // Retry-After everywhere, so health checks and clients see "loading", not "connection refused".
  serve::HttpServerOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.threads = o.http_threads;
  ho.read_timeout_s = o.read_timeout_s;
  auto loading = std::make_unique<serve::HttpServer>(ho, [](const serve::HttpRequest&) {
    serve::HttpResponse r;
    r.status = 503;
    r.headers.emplace_back("Retry-After", "5");
    r.body = R"({"error":{"message":"the model is loading; retry later","type":"service_unavailable","param":null,"code":"model_loading"}})";
    return r;
  });
  loading->start();

  runtime::StartupTimer startup;
  startup.begin("tokenizer");
  const std::string tok_path = find_tokenizer(o);
  spdlog::info("loading tokenizer {}", tok_path);
  auto text = serve::make_text_backend(tok_path);

  if (spec_method == spec::SpecMethod::dspark && o.no_dspark)
    fail("--spec-method dspark needs the DSpark stages: drop --no-dspark or use --spec-method none");
  const ModelConfig file_cfg = load_model_config(o.model_dir + "/config.json");
  DSV_CHECK(o.max_model_len <= file_cfg.max_position_embeddings,
            "--max-model-len {} is over the model's max_position_embeddings {}", o.max_model_len,
            file_cfg.max_position_embeddings);
  model::CudaModelOptions cuda_mo;  // --device cuda
  if (device == Device::cuda) {
    const runtime::CudaDeviceInfo dev = runtime::cuda_device_info(kCudaDevice);
    spdlog::info("device: cuda:{} {} ({} total, {} free{})", kCudaDevice, dev.name, runtime::format_gib(dev.total_bytes),
                 runtime::format_gib(dev.free_bytes), dev.integrated ? ", memory shared with the CPU" : "");
    cuda_mo.device = kCudaDevice;
    // State rooms and the indexer's score rows are sized for the longest context a request may have.
    cuda_mo.max_context = o.max_model_len > 0 ? o.max_model_len : file_cfg.max_position_embeddings;
    // Passes no longer than a step's token budget: the arena shrinks with --max-num-batched-tokens.
    runtime::ServeMemoryPlan step;
    step.world_size = o.world_size;
    step.max_num_batched_tokens = o.max_num_batched_tokens;
    cuda_mo.max_chunk_tokens = runtime::cuda_serve_pass_tokens(file_cfg, step, cuda_mo.max_chunk_tokens);
  } else {
    spdlog::info("device: cpu");
  }

  startup.begin("memory budget and weights");
  const std::unique_ptr<Checkpoint> ckpt = device == Device::cuda ? check_cuda_memory(o, cuda_mo) : check_memory_and_preload(o);
  startup.begin("engine");
  spdlog::info("loading checkpoint {}", o.model_dir);
  // The server opens the Engram store itself so that /metrics can report its reads.
  const engram::EngramStorageOptions storage = engram_storage(o);
  const std::shared_ptr<engram::EngramStore> engram_store = engram::open_engram_store(file_cfg, ckpt.get(), storage);
  std::unique_ptr<model::CpuModel> model;
  std::unique_ptr<dist::TpModel> tp_model;      // --world-size > 1: rank 0 of a tensor-parallel run
  std::unique_ptr<model::CudaModel> cuda_model;  // --device cuda
  // The DSpark stages serve speculative decoding alone: without it they would take memory, and
  // every pass would feed their taps and rings (~0.14 ms of a decode step of the 3-layer model on
  // the H200, after the head and before the token reaches the host).
  const bool load_dspark = !o.no_dspark && spec_method == spec::SpecMethod::dspark;
  if (device == Device::cuda) {
    cuda_mo.engram_token_map = o.engram_token_map;
    cuda_mo.dspark = load_dspark;
    cuda_mo.engram_storage = storage;
    cuda_mo.engram_store = engram_store;
    if (o.world_size > 1) {  // rank 0 of a CUDA tensor-parallel run: the DSpark stages are not split yet
      cuda_mo.dspark = false;
      tp_model = start_serve_tp_model_cuda(o, cuda_mo);
    } else {
      cuda_model = model::CudaModel::load(o.model_dir, cuda_mo);
    }
  } else {
    model::CpuModelOptions mo;
    mo.engram_token_map = o.engram_token_map;
    mo.dspark = load_dspark;
    mo.engram_storage = storage;
    mo.engram_store = engram_store;
    if (o.world_size > 1) tp_model = start_serve_tp_model(o, mo);
    else model = model::CpuModel::load(o.model_dir, mo);
  }
  Model& engine = cuda_model ? static_cast<Model&>(*cuda_model)
                  : tp_model ? static_cast<Model&>(*tp_model)
                             : static_cast<Model&>(*model);
  std::unique_ptr<spec::SpecBackend> spec_backend;
  if (spec_method == spec::SpecMethod::dspark) {
    const bool drafter = cuda_model ? cuda_model->has_dspark() : tp_model ? tp_model->has_dspark() : model->has_dspark();
    if (!drafter) fail("--spec-method dspark: {} has no DSpark (mtp.*) stages", o.model_dir);
    if (tp_model) spec_backend = spec::make_cpu_spec_backend(*tp_model);
    else if (model) spec_backend = spec::make_cpu_spec_backend(*model);
    else spec_backend = spec::make_cuda_spec_backend(*cuda_model);
  }
  const ModelConfig& cfg = engine.config();
  DSV_CHECK(static_cast<int64_t>(text->vocab_size()) <= cfg.vocab_size,
            "the tokenizer has {} tokens but the model's vocabulary is {}", text->vocab_size(), cfg.vocab_size);

  startup.begin("scheduler and guards");
  // Memory watchdog and stall detector (src/serve/runtime_guards.h); declared before the
  // scheduler so that they outlive its thread.
  serve::RuntimeGuards guards(runtime::meminfo_source(), runtime::watchdog_config(o.ops),
                              runtime::stall_config(o.ops, o.rank));
  sched::SchedulerOptions so;
  so.memory_ok = guards.memory_gate();
  so.max_num_seqs = o.max_num_seqs;
  so.max_num_batched_tokens = o.max_num_batched_tokens;
  so.max_model_len = o.max_model_len;
  so.kv_cache_gib = o.kv_cache_gib;
  so.max_waiting = o.max_waiting;
  so.spec.method = spec_method;
  so.spec.max_draft_tokens = o.spec_tokens;
  so.spec.adaptive = !o.spec_fixed_tokens;
  so.spec.disable_batch_size = o.spec_disable_batch_size;
  sched::Scheduler scheduler(engine, so, spec_backend.get());
  const auto& b = scheduler.state_bytes_info();
  const auto& pool = scheduler.pool();
  spdlog::info("sequence state: {} B per context token packed (MODEL.md §5.7; {} B as BF16), {} B fixed per sequence "
               "packed ({} B as BF16)",
               b.packed_per_token, b.bf16_per_token, b.packed_fixed, b.bf16_fixed);
  spdlog::info("state pool: {:.3f} GiB, room in blocks of {} tokens; this engine holds {} B for a sequence with room "
               "for {} tokens; capacity {} tokens (one sequence), max-model-len {}, max-num-seqs {}, "
               "max-num-batched-tokens {}",
               o.kv_cache_gib, pool.block_tokens(), engine.state_bytes(pool.block_tokens()), pool.block_tokens(),
               scheduler.capacity_tokens(), scheduler.max_model_len(), so.max_num_seqs, so.max_num_batched_tokens);
  if (cuda_model) {
    const model::CudaMemoryBreakdown mem = cuda_model->memory();
    const runtime::CudaDeviceInfo dev = runtime::cuda_device_info(kCudaDevice);
    spdlog::info("CUDA memory on cuda:{}: weights {}, scratch {}, state pool {} (device memory, drawn as sequences "
                 "grow); capacity {} tokens (one sequence); {} free after load",
                 kCudaDevice, runtime::format_gib(static_cast<uint64_t>(mem.weights)),
                 runtime::format_gib(static_cast<uint64_t>(mem.scratch)),
                 runtime::format_gib(static_cast<uint64_t>(pool.capacity_bytes())), scheduler.capacity_tokens(),
                 runtime::format_gib(dev.free_bytes));
  }

  guards.attach(scheduler);

  serve::ApiOptions ao;
  ao.model_names = o.served_model_names.empty() ? std::vector<std::string>{o.model_dir} : o.served_model_names;
  ao.api_key = api_key;
  guards.api_hooks(ao);
  if (tp_model) {
    // A lost or restarting rank makes the whole server unable to run a step: /health says which.
    ao.runtime_health = [base = ao.runtime_health, tp = tp_model.get(), n = o.world_size] {
      runtime::RuntimeHealth h = base ? base() : runtime::RuntimeHealth{};
      const std::string why = tp->unavailable_reason();
      h.detail["ranks"] = {{"world_size", n}, {"ready", why.empty()}, {"reason", why}};
      h.healthy = h.healthy && why.empty();
      return h;
    };
  }
  if (engram_store)
    ao.extra_metrics = [store = engram_store] { return engram::format_engram_metrics(store->metrics()); };
  if (tp_model)
    ao.extra_metrics = [base = ao.extra_metrics, tp = tp_model.get()] {
      return (base ? base() : std::string()) + dist::format_collective_metrics(tp->collective_stats());
    };
  serve::Api api(scheduler, *text, ao);

  loading->stop();
  loading.reset();
  serve::HttpServer http(ho, [&api](const serve::HttpRequest& r) { return api.handle(r); });

  // SIGINT/SIGTERM are taken by sigwait below; every thread started from here inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  runtime::install_thread_dump_handler();
  scheduler.start();
  guards.start();
  http.start();
  startup.finish();
  spdlog::info("serving {} on http://{}:{} (auth {})", ao.model_names.front(), o.host, http.port(),
               api_key.empty() ? "off" : "on");
  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("signal {}: shutting down", sig);
  api.set_ready(false);
  guards.stop();
  scheduler.stop();  // closes every channel, so streaming handlers return and HTTP threads free up
  http.stop();
  return 0;
}

}  // namespace dsv41::cli
