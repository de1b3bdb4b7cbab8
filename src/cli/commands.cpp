#include "cli/commands.h"

namespace dsv41::cli {

void register_commands(CLI::App& root, std::vector<Command>& out) {
  (void)root;
  (void)out;
}

}  // namespace dsv41::cli
