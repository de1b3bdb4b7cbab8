// Operations flags shared by the bare form (server and worker): memory margin, stall timeout, log
// directory. The env-file keys DSV41_MEMORY_MARGIN_GIB, DSV41_STALL_TIMEOUT_S and DSV41_LOG_DIR map
// onto them (dsv41/config/env_file.h).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "dsv41/runtime/stall_detector.h"
#include "dsv41/runtime/watchdog.h"

namespace dsv41::runtime {

struct OpsOptions {
  double memory_margin_gib = 4.0;  // --memory-margin-gib
  double stall_timeout_s = 60.0;   // --stall-timeout-s
  std::string log_dir = "logs";    // --log-dir (stall dumps)
};

void add_ops_options(CLI::App& app, OpsOptions& o);

// The watchdog / stall-detector configurations these flags imply (rank for dump file names).
WatchdogConfig watchdog_config(const OpsOptions& o);
StallConfig stall_config(const OpsOptions& o, int rank);

}  // namespace dsv41::runtime
