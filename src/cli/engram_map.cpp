// `dsv41-serve engram-map --tokenizer FILE --out FILE.json`: the Engram compressed token map
// ({"compressed_vocab_size": N, "token_map": [...]}); an --out ending in .safetensors writes the
// engine's --engram-token-map format (int32 tensor `token_map`) instead.
#include <fstream>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/text/engram_map.h"

namespace dsv41::cli {

Command add_engram_map(CLI::App& root) {
  auto* app = root.add_subcommand("engram-map", "Compute the Engram compressed token map of a tokenizer.json");
  auto tokenizer = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  app->add_option("--tokenizer", *tokenizer, "tokenizer.json (Hugging Face format)")->required();
  app->add_option("--out", *out, "Output file: .json, or .safetensors for --engram-token-map")->required();
  return {app, [tokenizer, out] {
            const auto tok = text::Tokenizer::from_file(*tokenizer);
            const auto map = text::compute_engram_token_map(tok);
            const bool st = out->size() >= 12 && out->compare(out->size() - 12, 12, ".safetensors") == 0;
            if (st) {
              text::write_engram_map_safetensors(map, *out);
            } else {
              std::ofstream f(*out, std::ios::binary);
              if (!f) fail("cannot write {}", *out);
              f << text::engram_map_to_json(map);
              if (!f) fail("cannot write {}", *out);
            }
            spdlog::info("engram map: {} ids -> {} classes, written to {}", map.token_map.size(),
                         map.compressed_vocab_size, *out);
            return 0;
          }};
}

}  // namespace dsv41::cli
