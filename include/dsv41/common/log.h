// Logging: spdlog with the rank in every line ("[r0]").
#pragma once
#include <spdlog/spdlog.h>

#include <string>

namespace dsv41 {

// Sets the global logger pattern and level. level: trace|debug|info|warn|error|critical|off.
void setup_logging(const std::string& level, int rank);

}  // namespace dsv41
