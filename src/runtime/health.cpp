#include "dsv41/runtime/health.h"

namespace dsv41::runtime {

RuntimeHealth runtime_health(const MemoryWatchdog* wd, const StallDetector* stall) {
  RuntimeHealth h;
  h.detail = nlohmann::json::object();
  if (wd) {
    h.admitting = wd->admitting();
    nlohmann::json m = {{"state", to_string(wd->state())},
                        {"available_bytes", wd->last_available_bytes()},
                        {"margin_bytes", wd->config().margin_bytes},
                        {"low_episodes", wd->low_episodes()}};
    if (!h.admitting) {
      m["reason"] = wd->last_reason();
      m["retry_after_s"] = wd->config().retry_after_s;
    }
    h.detail["memory"] = std::move(m);
  }
  if (stall) {
    h.healthy = stall->healthy();
    nlohmann::json s = {{"state", h.healthy ? "ok" : "stalled"}, {"dumps", stall->dumps()}};
    if (!h.healthy) s["reason"] = stall->health_reason();
    if (!stall->last_dump_path().empty()) s["last_dump"] = stall->last_dump_path();
    h.detail["stall"] = std::move(s);
  }
  return h;
}

}  // namespace dsv41::runtime
