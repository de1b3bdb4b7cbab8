#include "dsv41/runtime/ops_options.h"

#include <algorithm>

#include "dsv41/common/error.h"

namespace dsv41::runtime {

void add_ops_options(CLI::App& app, OpsOptions& o) {
  app.add_option("--memory-margin-gib", o.memory_margin_gib,
                 "Memory kept free: refuse to start below it, stop admitting requests below it at run time")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1024.0));
  app.add_option("--stall-timeout-s", o.stall_timeout_s,
                 "Seconds without step progress (while work is pending) before a stall dump and unhealthy /health")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--log-dir", o.log_dir, "Folder for stall dumps")->capture_default_str();
}

WatchdogConfig watchdog_config(const OpsOptions& o) {
  WatchdogConfig c;
  c.margin_bytes = gib_to_bytes(o.memory_margin_gib, "--memory-margin-gib");
  // Re-admit only with a quarter of the margin (at least 512 MiB) to spare, so admission does not flap.
  c.hysteresis_bytes = std::max<uint64_t>(c.margin_bytes / 4, kGiB / 2);
  return c;
}

StallConfig stall_config(const OpsOptions& o, int rank) {
  DSV_CHECK(o.stall_timeout_s >= 1.0, "--stall-timeout-s must be at least 1, got {}", o.stall_timeout_s);
  DSV_CHECK(!o.log_dir.empty(), "--log-dir must not be empty");
  StallConfig c;
  c.stall_after = std::chrono::milliseconds(int64_t(o.stall_timeout_s * 1000.0));
  c.period = std::min(std::chrono::milliseconds(1000), c.stall_after / 4);
  c.dump_dir = o.log_dir;
  c.rank = rank;
  return c;
}

}  // namespace dsv41::runtime
