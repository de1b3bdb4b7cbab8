#include "cli/commands.h"

namespace dsv41::cli {

void register_commands(CLI::App& root, std::vector<Command>& out) {
  (void)root;
  (void)out;
  out.push_back(add_inspect(root));
  out.push_back(add_tokenize(root));
  out.push_back(add_render(root));
  out.push_back(add_engram_map(root));
  out.push_back(add_exl3_dequant(root));
  out.push_back(add_mkmodel(root));
  out.push_back(add_fabric(root));
  out.push_back(add_logits(root));
  out.push_back(add_generate(root));
  out.push_back(add_pack_engram(root));
  out.push_back(add_bench(root));
}

}  // namespace dsv41::cli
