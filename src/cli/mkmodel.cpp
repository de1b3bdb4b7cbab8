// `dsv41-serve mkmodel --config FILE --format exl3|fp8 --bits B --seed S --out DIR`: writes a random
// checkpoint of any config (the tensor list of expected_tensors, values per mkmodel/value_rules.h),
// deterministic in the seed and independent of the thread count. Used for the bundled demo model
// and for large-shape test models (--layers N keeps the first N backbone layers).
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/exl3/codebook.h"
#include "dsv41/loader/manifest.h"
#include "mkmodel/bits_plan.h"
#include "mkmodel/checkpoint_writer.h"
#include "mkmodel/config_edit.h"

namespace dsv41::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct MkmodelOptions {
  std::string config, format, out, codebook = "mul1";
  double bits = 3.0;
  uint64_t seed = 0;
  int64_t layers = 0;
  int64_t engram_vocab_size = 0;
  int head_bits = 6, mtp_bits = 4;
  uint64_t shard_mb = 4000;
  bool skip_optional = false;
};

// Non-weight files a checkpoint folder usually carries next to config.json.
bool is_companion_file(const std::string& name) {
  return name.rfind("tokenizer", 0) == 0 || name == "generation_config.json" || name == "special_tokens_map.json" ||
         name.rfind("chat_template", 0) == 0;
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream out(p);
  out << j.dump(2) << "\n";
  if (!out) fail("{}: write failed", p.string());
}

int run_mkmodel(const MkmodelOptions& o) {
  const CheckpointFormat fmt = o.format == "exl3" ? CheckpointFormat::kExl3 : CheckpointFormat::kFp8;
  exl3::codebook_from_name(o.codebook);  // validates the name
  json root = mkmodel::read_config_json(o.config);
  if (o.layers > 0) mkmodel::truncate_layers(root, o.layers, o.config);
  if (o.engram_vocab_size > 0) mkmodel::set_engram_vocab_size(root, o.engram_vocab_size, o.config);
  const ModelConfig src_cfg = parse_model_config(root.dump(), o.config);
  if (auto problems = validate_config(src_cfg); !problems.empty())
    fail("{}: {}{}", o.config, problems.front(),
         problems.size() > 1 ? fmt::format(" (and {} more problems)", problems.size() - 1) : "");

  std::unique_ptr<mkmodel::BitsPlanResult> plan;
  if (fmt == CheckpointFormat::kExl3)
    plan = std::make_unique<mkmodel::BitsPlanResult>(
        mkmodel::plan_bits(src_cfg, o.bits, o.head_bits, o.mtp_bits, o.codebook));
  mkmodel::set_quantization_config(root, fmt, plan.get());
  const ModelConfig cfg = parse_model_config(root.dump(), o.config);
  std::vector<TensorSpec> specs = expected_tensors(cfg, fmt, plan ? plan->plan : Exl3Plan{});
  if (o.skip_optional) std::erase_if(specs, [](const TensorSpec& t) { return t.optional; });

  const fs::path out(o.out);
  if (fs::exists(out)) {
    if (!fs::is_directory(out)) fail("--out {}: exists and is not a directory", o.out);
    for (const auto& e : fs::directory_iterator(out)) {
      const std::string n = e.path().filename().string();
      if (e.path().extension() == ".safetensors" || n == "model.safetensors.index.json")
        fail("--out {}: already holds a checkpoint ({}); remove it first", o.out, n);
    }
  }
  // Enough disk space? Checked on the nearest existing folder, before anything is created.
  uint64_t total_bytes = 0;
  for (const TensorSpec& t : specs) total_bytes += t.nbytes();
  fs::path probe = fs::absolute(out);
  while (!fs::exists(probe) && probe.has_parent_path() && probe != probe.parent_path()) probe = probe.parent_path();
  mkmodel::require_free_space(probe.string(), total_bytes);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) fail("--out {}: cannot create: {}", o.out, ec.message());

  write_json(out / "config.json", root);
  if (plan) {  // informational, as exllamav3 writes it: the plan per linear
    json q = root["quantization_config"];
    json storage = json::object();
    const std::string marker_key = o.codebook == "mcg" ? "mcg_multiplier" : "mul1_multiplier";
    for (const TensorSpec& t : specs) {
      if (!t.exl3_trellis) continue;
      json e = {{"quant_format", "exl3"}, {"bits_per_weight", t.shape[2] / 16}};
      if (o.codebook != "3inst")
        e[marker_key] = o.codebook == "mcg" ? exl3::kMcgMultiplier : exl3::kMul1Multiplier;
      storage[t.exl3_linear] = e;
    }
    q["tensor_storage"] = storage;
    write_json(out / "quantization_config.json", q);
  }
  const fs::path src_dir = fs::path(o.config).parent_path().empty() ? fs::path(".") : fs::path(o.config).parent_path();
  for (const auto& e : fs::directory_iterator(src_dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && is_companion_file(n) && !fs::equivalent(src_dir, out))
      fs::copy_file(e.path(), out / n, fs::copy_options::overwrite_existing);
  }

  mkmodel::WriteOptions wo;
  wo.out_dir = o.out;
  wo.seed = o.seed;
  wo.shard_bytes = o.shard_mb * 1000000ull;
  const mkmodel::WriteStats st = mkmodel::write_random_checkpoint(specs, cfg, wo);
  fmt::print("{}: {} tensors, {} bytes in {} shard(s), format {}", o.out, st.tensors, st.bytes, st.shards, o.format);
  if (plan)
    fmt::print(", {:.2f} bpw over {} budgeted weights (head {}, mtp {}, codebook {})", plan->achieved_bits,
               plan->budgeted_weights, o.head_bits, o.mtp_bits, o.codebook);
  fmt::print("\n");
  return 0;
}

}  // namespace

Command add_mkmodel(CLI::App& root) {
  auto o = std::make_shared<MkmodelOptions>();
  CLI::App* app = root.add_subcommand("mkmodel", "Write a random checkpoint of a config (EXL3 or FP8 format)");
  app->add_option("--config", o->config, "config.json of the model")->required()->check(CLI::ExistingFile);
  app->add_option("--format", o->format, "Storage format: exl3 or fp8")
      ->required()
      ->check(CLI::IsMember({"exl3", "fp8"}));
  app->add_option("--bits", o->bits, "EXL3 mean bits per weight over budgeted linears (1..8, fractional ok)")
      ->capture_default_str();
  app->add_option("--seed", o->seed, "Random seed (0 .. 2^64-1)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app->add_option("--out", o->out, "Output folder")->required();
  app->add_option("--layers", o->layers, "Keep only the first N backbone layers (num_hidden_layers override)")
      ->check(CLI::PositiveNumber);
  app->add_option("--engram-vocab-size", o->engram_vocab_size,
                  "Override engram_vocab_size (Engram table rows are recomputed from it)")
      ->check(CLI::PositiveNumber);
  app->add_option("--head-bits", o->head_bits, "EXL3 bits of the output head (16 = unquantized)")->capture_default_str();
  app->add_option("--mtp-bits", o->mtp_bits, "EXL3 bits of the DSpark (mtp.*) linears")->capture_default_str();
  app->add_option("--codebook", o->codebook, "EXL3 codebook: mul1, mcg or 3inst")
      ->capture_default_str()
      ->check(CLI::IsMember({"mul1", "mcg", "3inst"}));
  app->add_option("--shard-mb", o->shard_mb, "Maximum shard size in MB")->capture_default_str()->check(
      CLI::PositiveNumber);
  app->add_flag("--skip-optional", o->skip_optional,
                "Leave out tensors a checkpoint of this format may omit (EXL3: Engram tables, vision)");
  return Command{app, [o] { return run_mkmodel(*o); }};
}

}  // namespace dsv41::cli
