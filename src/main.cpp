// dsv41-serve: the bare form serves (rank 0) or joins as a worker (rank > 0); subcommands are
// tools (inspect, logits, tokenize, ...). Exceptions of type dsv41::Error end here as one message.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <vector>

#include "cli/commands.h"
#include "cli/serve_options.h"
#include "dsv41/common/error.h"
#include "dsv41/common/log.h"
#include "dsv41/config/env_file.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv41-serve: DeepSeek-V4.1-Flash inference server (OpenAI-compatible API)", "dsv41-serve"};
  app.set_version_flag("--version", DSV41_VERSION);
  app.require_subcommand(0, 1);
  app.fallthrough();
  dsv41::cli::ServeOptions serve;
  dsv41::cli::add_serve_options(app, serve);
  std::vector<dsv41::cli::Command> commands;
  dsv41::cli::register_commands(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    // --config FILE fills every option not given on the command line (flags win), then logging
    // starts so that a DSV41_LOG_LEVEL from the file takes effect.
    dsv41::config::EnvApplyResult from_file;
    if (!serve.config_file.empty()) from_file = dsv41::config::apply_env_file(app, serve.config_file);
    dsv41::setup_logging(serve.log_level, serve.rank);
    if (!serve.config_file.empty()) dsv41::config::log_env_apply_result(serve.config_file, from_file);
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
    return dsv41::cli::run_serve(serve);
  } catch (const dsv41::Error& e) {
    spdlog::default_logger()->flush();
    std::fprintf(stderr, "dsv41-serve: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::default_logger()->flush();
    std::fprintf(stderr, "dsv41-serve: internal error: %s\n", e.what());
    return 2;
  }
}
