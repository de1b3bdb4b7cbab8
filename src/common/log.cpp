#include "dsv41/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

#include "dsv41/common/error.h"

namespace dsv41 {

void setup_logging(const std::string& level, int rank) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") fail("unknown --log-level '{}'", level);
  // Logs go to stderr so that tools (tokenize, render, inspect --json, generate) keep stdout clean.
  spdlog::drop("dsv41");
  auto logger = spdlog::stderr_color_mt("dsv41");
  logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [r{}] [%^%l%$] %v", rank));
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  spdlog::critical("assertion failed: {} at {}:{}: {}", cond, file, line, msg);
  spdlog::default_logger()->flush();
  std::abort();
}

}  // namespace dsv41
