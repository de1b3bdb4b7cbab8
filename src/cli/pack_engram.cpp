// `dsv41-serve pack-engram --engram-dir DIR --rank R --world-size N --out DIR`: writes the Engram
// rows of tensor-parallel rank R (docs/ENGRAM.md) into checksummed local files for
// `--engram-packed DIR`. Resumable: run the same command again after an interruption. Progress
// goes to stderr; a JSON summary to stdout.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/engram/geometry.h"
#include "dsv41/engram/pack.h"

namespace dsv41::cli {

namespace {
struct PackEngramArgs {
  engram::PackOptions pack;
  std::string model_dir;
  bool no_progress = false;
};
}  // namespace

Command add_pack_engram(CLI::App& root) {
  auto* app = root.add_subcommand("pack-engram", "Pack one tensor-parallel rank's Engram table rows into local files");
  auto a = std::make_shared<PackEngramArgs>();
  app->add_option("--engram-dir", a->pack.engram_dir,
                  "Folder with the original model.safetensors.index.json and the shards holding the Engram tables")
      ->required();
  app->add_option("--rank", a->pack.rank, "Tensor-parallel rank to pack for")->default_val(0);
  app->add_option("--world-size", a->pack.world_size, "Tensor-parallel world size")->default_val(1);
  app->add_option("--out", a->pack.out_dir, "Output folder (created; an interrupted pack there is resumed)")->required();
  app->add_option("--model", a->model_dir,
                  "Checkpoint folder whose config.json to use (default: config.json inside --engram-dir)");
  app->add_option("--max-rows", a->pack.max_rows, "Stop after packing this many rows (resume later)");
  app->add_flag("--no-progress", a->no_progress, "No progress bar on stderr");
  return {app, [a] {
            namespace fs = std::filesystem;
            const std::string cfg_dir = a->model_dir.empty() ? a->pack.engram_dir : a->model_dir;
            const std::string cfg_path = (fs::path(cfg_dir) / "config.json").string();
            if (!fs::exists(cfg_path))
              fail("pack-engram: {} not found: copy the checkpoint's config.json there or pass --model DIR", cfg_path);
            const ModelConfig cfg = load_model_config(cfg_path);
            const auto geo = engram::EngramGeometry::from_config(cfg);
            a->pack.progress = !a->no_progress;
            const auto r = engram::pack_engram(geo, a->pack);
            nlohmann::ordered_json j;
            j["index"] = r.index_path;
            j["complete"] = r.complete;
            j["rows_total"] = r.rows_total;
            j["rows_done"] = r.rows_done;
            j["rows_written"] = r.rows_written;
            j["rows_resumed"] = r.rows_resumed;
            j["bytes_total"] = r.rows_total * geo.row_bytes;
            j["files"] = r.files;
            std::printf("%s\n", j.dump(2).c_str());
            return 0;
          }};
}

}  // namespace dsv41::cli
