// Subcommands of dsv41-serve. Each add_* attaches one CLI11 subcommand to the root app and
// returns the function that runs it once parsed (its return value is the process exit code).
// Adding a subcommand: write src/cli/<name>.cpp with add_<name>(), declare it here, and list it
// in register_commands() (src/cli/commands.cpp).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace dsv41::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

void register_commands(CLI::App& root, std::vector<Command>& out);

Command add_inspect(CLI::App& root);
Command add_tokenize(CLI::App& root);
Command add_render(CLI::App& root);
Command add_engram_map(CLI::App& root);
Command add_fabric(CLI::App& root);
Command add_exl3_dequant(CLI::App& root);
Command add_mkmodel(CLI::App& root);
Command add_logits(CLI::App& root);
Command add_generate(CLI::App& root);
Command add_pack_engram(CLI::App& root);
Command add_bench(CLI::App& root);

}  // namespace dsv41::cli
