// `dsv41-serve generate`: generates from a prompt-ids file through the server's engine loop
// (scheduler, sampler, speculative decoding) and prints one JSON object
//   {"ids": [...], "accepted": [...], "steps": N}
// ids: the generated tokens after the prompt (ending with EOS when the model produced it);
// accepted: tokens committed at each target step (1 without speculation, accepted drafts + 1 with
// it); steps: the number of target steps that committed tokens.
#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/prompt_tools.h"
#include "cli/tp_options.h"
#include "dsv41/common/error.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/spec/cpu_backend.h"
#include "dsv41/spec/cuda_backend.h"
#include "dsv41/spec/options.h"
#include "sched/scheduler.h"

namespace dsv41::cli {
namespace {

struct GenerateOptions {
  ModelLoadArgs load;
  std::string prompt_ids;
  int64_t max_tokens = 0;
  std::string spec_method;  // empty: dspark when the checkpoint has DSpark stages, else none
  int64_t spec_tokens = 0;  // 0: the drafter's block size
  bool fixed_spec_tokens = false;
  double temperature = 0.0;
  int64_t seed = -1;        // < 0: unseeded
  TpArgs tp;  // --world-size/--master-addr/--master-port: this tool as rank 0 of a TP run
};

// The engine generate runs on: a model and, for speculation, its drafting/verification backend.
struct Engine {
  std::unique_ptr<Model> model;
  std::unique_ptr<spec::SpecBackend> spec;
};

// The single place where other engines plug in: --device cuda (the CUDA backend) and
// --world-size > 1 (tensor parallelism). Everything after it only sees Model and SpecBackend.
// `dspark`: load the drafter and its backend; `required`: a checkpoint without one is an error.
Engine open_engine(const GenerateOptions& o, bool dspark, bool required) {
  model::CpuModelOptions mo = cpu_model_options(o.load);
  mo.dspark = dspark;
  if (o.load.device == "cuda") {  // the CUDA backend and its speculation backend (src/spec/cuda_backend.cpp)
    DSV_CHECK(o.tp.world_size <= 1, "--device cuda: generate runs the CUDA backend on one GPU (no --world-size)");
    model::CudaModelOptions co;
    co.engram_token_map = mo.engram_token_map;
    co.engram_storage = mo.engram_storage;
    co.corrected_index_keys = mo.corrected_index_keys;
    co.dspark = dspark;
    auto m = model::CudaModel::load(o.load.model_dir, co);
    Engine e;
    if (dspark && !m->has_dspark())
      DSV_CHECK(!required, "--spec-method dspark: {} has no DSpark (mtp.*) stages; use --spec-method none",
                o.load.model_dir);
    if (dspark && m->has_dspark()) e.spec = spec::make_cuda_spec_backend(*m);
    e.model = std::move(m);
    return e;
  }
  require_cpu_device(o.load, "generate");
  if (o.tp.world_size > 1) {
    auto m = start_tool_tp_model(o.tp, o.load, mo);
    Engine e;
    if (dspark && !m->has_dspark())
      DSV_CHECK(!required, "--spec-method dspark: {} has no DSpark (mtp.*) stages; use --spec-method none",
                o.load.model_dir);
    if (dspark && m->has_dspark()) e.spec = spec::make_cpu_spec_backend(*m);
    e.model = std::move(m);
    return e;
  }
  auto m = model::CpuModel::load(o.load.model_dir, mo);
  Engine e;
  if (dspark && !m->has_dspark())
    DSV_CHECK(!required, "--spec-method dspark: {} has no DSpark (mtp.*) stages; use --spec-method none",
              o.load.model_dir);
  if (dspark && m->has_dspark()) e.spec = spec::make_cpu_spec_backend(*m);
  e.model = std::move(m);
  return e;
}

int run_generate(const GenerateOptions& o) {
  spec::SpecMethod method =
      o.spec_method.empty() ? spec::SpecMethod::dspark : spec::parse_spec_method(o.spec_method);
  DSV_CHECK(o.max_tokens >= 1, "--max-tokens {}: expected at least 1", o.max_tokens);
  DSV_CHECK(o.temperature >= 0.0, "--temperature {}: expected a value >= 0", o.temperature);
  const std::vector<int32_t> prompt = read_prompt_ids(o.prompt_ids);
  Engine engine = open_engine(o, method == spec::SpecMethod::dspark, !o.spec_method.empty());
  if (!engine.spec) method = spec::SpecMethod::none;
  const ModelConfig& c = engine.model->config();
  check_prompt_ids(prompt, c.vocab_size, o.prompt_ids);
  const int64_t need = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  DSV_CHECK(need <= c.max_position_embeddings,
            "prompt ({} tokens) + --max-tokens {} exceeds the model's context (max_position_embeddings = {})",
            prompt.size(), o.max_tokens, c.max_position_embeddings);

  sched::SchedulerOptions so;
  so.max_num_seqs = 1;
  // The whole prompt in one prefill step, and room for a full verify step.
  so.max_num_batched_tokens = static_cast<int64_t>(prompt.size()) + c.dspark_block_size + 1;
  so.max_model_len = need;
  // One sequence: the pool only has to hold it (the CPU engine allocates what it uses).
  so.kv_cache_gib = 2.0 * static_cast<double>(engine.model->state_bytes(need)) / (1024.0 * 1024.0 * 1024.0) + 1e-3;
  so.spec.method = method;
  so.spec.max_draft_tokens = o.spec_tokens;
  so.spec.adaptive = !o.fixed_spec_tokens;
  if (method == spec::SpecMethod::dspark && o.spec_tokens > c.dspark_block_size)
    spdlog::warn("--spec-tokens {}: the drafter proposes at most {} tokens (dspark_block_size); using {}",
                 o.spec_tokens, c.dspark_block_size, c.dspark_block_size);
  sched::Scheduler scheduler(*engine.model, so, engine.spec.get());

  sched::GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = o.max_tokens;
  r.sampling.temperature = o.temperature;
  r.sampling.top_p = 1.0;
  if (o.seed >= 0) {
    r.sampling.has_seed = true;
    r.sampling.seed = static_cast<uint64_t>(o.seed);
  }
  scheduler.start();
  auto ch = scheduler.submit(std::move(r));
  std::vector<sched::SampledToken> got;
  while (!ch->wait(got, std::chrono::milliseconds(100))) {
  }
  scheduler.stop();
  if (ch->finish_reason() == sched::FinishReason::error) fail("generation failed: {}", ch->error());

  nlohmann::ordered_json out;
  std::vector<int32_t> ids;
  std::vector<int64_t> accepted;
  int64_t last_step = 0;
  for (const auto& t : got) {
    ids.push_back(t.id);
    if (t.step != last_step) {
      accepted.push_back(0);
      last_step = t.step;
    }
    ++accepted.back();
  }
  out["ids"] = ids;
  out["accepted"] = accepted;
  out["steps"] = static_cast<int64_t>(accepted.size());
  fmt::print("{}\n", out.dump());
  const auto st = scheduler.stats().spec;
  if (st.verify_steps > 0)
    spdlog::info("speculative decoding: {} verify steps, {} of {} drafts accepted ({:.1f} %), {:.2f} tokens per step",
                 st.verify_steps, st.accepted_tokens, st.draft_tokens, 100.0 * st.acceptance_rate(),
                 st.mean_accepted_length());
  return 0;
}

}  // namespace

Command add_generate(CLI::App& root) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* app = root.add_subcommand(
      "generate", "Generate tokens after a prompt-ids file (optionally with DSpark speculative decoding); prints JSON");
  add_model_load_options(app, o->load);
  app->add_option("--prompt-ids", o->prompt_ids, "JSON file with an array of token ids")->required();
  app->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most (EOS ends earlier)")->required();
  app->add_option("--spec-method", o->spec_method,
                  "Speculative decoding: dspark or none (default: dspark when the checkpoint has DSpark stages)");
  app->add_option("--spec-tokens", o->spec_tokens,
                  "Draft tokens per step at most (default and upper limit: the drafter's block size)")
      ->check(CLI::PositiveNumber);
  app->add_flag("--spec-fixed-tokens", o->fixed_spec_tokens,
                "Always verify --spec-tokens drafts (default: adaptive length from the confidence head and the "
                "running acceptance)");
  app->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  app->add_option("--seed", o->seed, "Sampling seed (reproducible output)")->check(CLI::NonNegativeNumber);
  add_tp_options(app, o->tp);
  return Command{app, [o] { return run_generate(*o); }};
}

}  // namespace dsv41::cli
