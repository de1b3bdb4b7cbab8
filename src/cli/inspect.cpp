// `dsv41-serve inspect --model DIR [--json] [--world-size N] [--engram-dir DIR]` and
// `dsv41-serve inspect --config-only FILE [--json] [--world-size N] [--format fp8|exl3]`.
// Prints the architecture, tensor/parameter/byte counts by component, EXL3 bit widths, a per-rank
// memory estimate and every validation problem. Exit code 0 only when the config is valid and (with
// --model) the checkpoint is complete and matches the manifest; otherwise 1, report still printed.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/inspect_report.h"
#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/manifest.h"

namespace dsv41::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;  // key order kept: the report reads top-down

struct InspectOptions {
  std::string model_dir;
  std::string config_only;
  std::string format;  // override for --config-only: fp8 | exl3 (default: the config's)
  std::string engram_dir;
  int world_size = 1;
  bool json = false;
};

constexpr const char* kPartition =
    "reference partition (model.py): routed experts split by expert id; query heads split "
    "(wq_b, wo_a groups, wo_b rows, attn_sink, indexer wq_b/weights_proj); embedding, head and "
    "DSpark Markov tables split by vocabulary rows; Engram table rows split; everything else "
    "(wq_a, wkv, norms, mHC, compressors, indexer wk, routers, shared experts, Engram wkv, "
    "main_proj, confidence head) replicated. Bytes as stored (FP8/FP4/EXL3), before any load-time "
    "widening.";

ojson component_json(const Report& r) {
  ojson j = ojson::object();
  for (int i = 0; i < kNumComponents; ++i) {
    const auto& c = r.components[static_cast<size_t>(i)];
    j[component_name(static_cast<Component>(i))] = {{"tensors", c.tensors}, {"parameters", c.parameters}, {"bytes", c.bytes}};
  }
  return j;
}

ojson exl3_json(const Exl3Stats& s) {
  ojson hist = ojson::object();
  for (const auto& [k, n] : s.k_histogram) hist[std::to_string(k)] = n;
  return {{"linears", s.linears}, {"weights", s.weights}, {"storage_bytes", s.storage_bytes},
          {"mean_k", s.mean_k()}, {"bits_per_weight", s.bits_per_weight()}, {"k_histogram", hist}};
}

ojson ranks_json(const Report& r, int world_size) {
  ojson ranks = ojson::array();
  for (const auto& re : r.ranks) {
    ojson comp = ojson::object();
    for (int i = 0; i < kNumComponents; ++i)
      comp[component_name(static_cast<Component>(i))] = re.by_component[static_cast<size_t>(i)];
    ranks.push_back({{"rank", re.rank}, {"resident_bytes", re.resident_bytes},
                     {"engram_table_bytes", re.engram_table_bytes}, {"vision_bytes", re.vision_bytes},
                     {"by_component", comp}});
  }
  return {{"world_size", world_size}, {"partition", kPartition}, {"ranks", ranks}};
}

ojson config_json(const ModelConfig& c) {
  return {{"architecture", c.architecture},
          {"model_type", c.model_type},
          {"quant_method", c.quant.method},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_nextn_predict_layers", c.num_nextn_predict_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"head_dim", c.head_dim},
          {"n_routed_experts", c.n_routed_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"moe_intermediate_size", c.moe_intermediate_size},
          {"compress_ratios", c.compress_ratios},
          {"kv_source_layer_ids", c.kv_source_layer_ids},
          {"index_source_layer_ids", c.index_source_layer_ids},
          {"engram_layer_ids", c.engram_layer_ids},
          {"engram_num_embeddings", c.engram_num_embeddings},
          {"dspark_target_layer_ids", c.dspark_target_layer_ids},
          {"vision_layers", c.vision.num_hidden_layers}};
}

// Decimal units (the release quotes GB = 1e9 bytes).
std::string gb(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.2f} kB", b / 1e3);
  return fmt::format("{} B", bytes);
}

void print_text(const InspectOptions& o, const ModelConfig* cfg, const std::string& fmt_name,
                const std::optional<Report>& expected, const std::optional<Report>& files, size_t n_files,
                const Report& main, const std::vector<std::string>& problems) {
  std::string s;
  s += o.model_dir.empty() ? fmt::format("config: {} (expected manifest only)\n", o.config_only)
                           : fmt::format("checkpoint: {}\n", o.model_dir);
  if (cfg) {
    s += fmt::format("architecture: {} ({}), format {}\n", cfg->architecture, cfg->model_type, fmt_name);
    s += architecture_summary(*cfg);
  }
  if (expected)
    s += fmt::format("expected manifest: {} tensors, {} bytes ({}), {} parameters\n", expected->n_tensors,
                     expected->total_bytes, gb(expected->total_bytes), expected->parameters);
  if (files)
    s += fmt::format("files read: {} tensors in {} files, {} bytes ({}), {} parameters\n", files->n_tensors, n_files,
                     files->total_bytes, gb(files->total_bytes), files->parameters);
  s += fmt::format("\n{:<16} {:>9} {:>18} {:>20}\n", "component", "tensors", "parameters", "bytes");
  for (int i = 0; i < kNumComponents; ++i) {
    const auto& c = main.components[static_cast<size_t>(i)];
    if (c.tensors == 0) continue;
    s += fmt::format("{:<16} {:>9} {:>18} {:>20}  ({})\n", component_name(static_cast<Component>(i)), c.tensors,
                     c.parameters, c.bytes, gb(c.bytes));
  }
  s += fmt::format("{:<16} {:>9} {:>18} {:>20}  ({})\n", "total", main.n_tensors, main.parameters, main.total_bytes,
                   gb(main.total_bytes));
  if (main.exl3.linears > 0) {
    s += fmt::format("\nEXL3: {} linears, mean K {:.3f}, {:.3f} bits per weight with suh/svh\n", main.exl3.linears,
                     main.exl3.mean_k(), main.exl3.bits_per_weight());
    for (int i = 0; i < kNumComponents; ++i) {
      const auto& e = main.exl3_by_component[static_cast<size_t>(i)];
      if (e.linears == 0) continue;
      std::string hist;
      for (const auto& [k, n] : e.k_histogram) hist += fmt::format(" K{}:{}", k, n);
      s += fmt::format("  {:<16} {:>7} linears, mean K {:.3f}, {:.3f} bpw;{}\n", component_name(static_cast<Component>(i)),
                       e.linears, e.mean_k(), e.bits_per_weight(), hist);
    }
  }
  s += fmt::format("\nper-rank memory estimate, world size {}:\n", o.world_size);
  for (const auto& re : main.ranks)
    s += fmt::format("  rank {}: resident {} ({} bytes), Engram table rows {} (file-backed), vision {} (not loaded)\n",
                     re.rank, gb(re.resident_bytes), re.resident_bytes, gb(re.engram_table_bytes), gb(re.vision_bytes));
  s += fmt::format("  partition: {}\n", kPartition);
  if (problems.empty()) {
    s += "\nno problems: the ";
    s += o.model_dir.empty() ? "config is valid\n" : "checkpoint is complete and valid\n";
  } else {
    s += fmt::format("\n{} problem{}:\n", problems.size(), problems.size() == 1 ? "" : "s");
    for (const auto& p : problems) s += "  - " + p + "\n";
  }
  std::fwrite(s.data(), 1, s.size(), stdout);
}

int run_inspect(const InspectOptions& o) {
  if (o.model_dir.empty() == o.config_only.empty()) fail("inspect: give exactly one of --model DIR or --config-only FILE");
  if (o.world_size < 1 || o.world_size > 4096) fail("inspect: --world-size must be in 1..4096");
  // A path that is not there is a usage error, not a validation problem of a checkpoint.
  std::error_code ec;
  if (!o.model_dir.empty() && !fs::is_directory(o.model_dir, ec))
    fail("inspect --model {}: not a directory", o.model_dir);
  if (!o.config_only.empty() && !fs::is_regular_file(o.config_only, ec))
    fail("inspect --config-only {}: no such file", o.config_only);
  if (!o.format.empty() && !o.model_dir.empty())
    fail("inspect: --format applies to --config-only only (a checkpoint's format is its config's quant_method)");
  std::vector<std::string> problems;

  const std::string config_path = o.model_dir.empty() ? o.config_only : (fs::path(o.model_dir) / "config.json").string();
  std::optional<ModelConfig> cfg;
  try {
    cfg = load_model_config(config_path);
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  bool config_valid = false;
  if (cfg) {
    for (auto& p : validate_config(*cfg)) problems.push_back(config_path + ": " + p);
    config_valid = problems.empty();
  }
  CheckpointFormat fmt = CheckpointFormat::kFp8;
  std::string fmt_name = "unknown";
  if (cfg && config_valid) {
    fmt = o.format.empty() ? checkpoint_format(*cfg) : o.format == "exl3" ? CheckpointFormat::kExl3 : CheckpointFormat::kFp8;
    fmt_name = fmt == CheckpointFormat::kExl3 ? "exl3" : "fp8";
  }
  const ModelConfig* cfgp = cfg ? &*cfg : nullptr;

  std::optional<Report> expected;
  if (config_valid) {
    const Exl3Plan plan = exl3_plan_from_config(*cfg);
    expected = make_report(rows_from_manifest(expected_tensors(*cfg, fmt, plan)), cfgp, o.world_size);
  }

  std::optional<Report> files;
  size_t n_files = 0;
  if (!o.model_dir.empty()) {
    std::unique_ptr<Checkpoint> ckpt;
    try {
      ckpt = Checkpoint::open(o.model_dir);
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
    if (ckpt) {
      std::vector<TensorRow> rows;
      for (const TensorInfo* t : ckpt->tensors()) rows.push_back(TensorRow{t->name, t->dtype, t->shape, t->nbytes});
      files = make_report(rows, cfgp, o.world_size);
      n_files = ckpt->files().size();
      if (config_valid) {
        CheckOptions opt;
        opt.engram_tables_external = !o.engram_dir.empty();
        for (auto& p : check_checkpoint(*cfg, fmt, *ckpt, opt)) problems.push_back(p);
      }
    }
  }
  // The headline numbers: the files read when there are any, else the expected manifest.
  const Report empty = make_report({}, cfgp, o.world_size);
  const Report& main = files ? *files : expected ? *expected : empty;

  if (o.json) {
    ojson j;
    j["n_tensors"] = main.n_tensors;
    j["total_bytes"] = main.total_bytes;
    j["parameters"] = main.parameters;
    j["source"] = files ? "checkpoint" : "manifest";
    j["path"] = o.model_dir.empty() ? o.config_only : o.model_dir;
    j["format"] = fmt_name;
    j["config"] = cfg ? config_json(*cfg) : ojson(nullptr);
    j["expected"] = expected ? ojson{{"n_tensors", expected->n_tensors}, {"total_bytes", expected->total_bytes},
                                    {"parameters", expected->parameters}}
                             : ojson(nullptr);
    j["checkpoint"] = files ? ojson{{"n_tensors", files->n_tensors}, {"total_bytes", files->total_bytes},
                                   {"parameters", files->parameters}, {"n_files", n_files}}
                            : ojson(nullptr);
    j["components"] = component_json(main);
    ojson ex = exl3_json(main.exl3);
    ojson exc = ojson::object();
    for (int i = 0; i < kNumComponents; ++i)
      if (main.exl3_by_component[static_cast<size_t>(i)].linears)
        exc[component_name(static_cast<Component>(i))] = exl3_json(main.exl3_by_component[static_cast<size_t>(i)]);
    ex["by_component"] = exc;
    j["exl3"] = ex;
    j["per_rank"] = ranks_json(main, o.world_size);
    j["valid"] = problems.empty();
    j["problems"] = problems;
    const std::string out = j.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    print_text(o, cfgp, fmt_name, expected, files, n_files, main, problems);
  }
  std::fflush(stdout);
  return problems.empty() ? 0 : 1;
}

}  // namespace

Command add_inspect(CLI::App& root) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* app = root.add_subcommand("inspect", "Report a checkpoint's architecture, sizes and every validation problem");
  app->add_option("--model", o->model_dir, "Checkpoint folder (config.json + *.safetensors)");
  app->add_option("--config-only", o->config_only, "Only a config.json: report the expected manifest");
  app->add_flag("--json", o->json, "Print one JSON object instead of text");
  app->add_option("--world-size", o->world_size, "Ranks for the per-rank memory estimate")->capture_default_str();
  app->add_option("--engram-dir", o->engram_dir, "Engram tables live in this folder: their absence is not a problem");
  app->add_option("--format", o->format, "With --config-only: manifest of this format (fp8|exl3)")
      ->check(CLI::IsMember({"fp8", "exl3"}));
  return {app, [o] { return run_inspect(*o); }};
}

}  // namespace dsv41::cli
