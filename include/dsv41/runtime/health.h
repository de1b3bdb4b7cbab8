// What /health reports about the runtime guards: the memory watchdog (admitting or not) and the
// stall detector (healthy or stalled). The server merges this into its /health answer and
// returns 503 when `healthy` is false.
#pragma once
#include <nlohmann/json.hpp>

#include "dsv41/runtime/stall_detector.h"
#include "dsv41/runtime/watchdog.h"

namespace dsv41::runtime {

struct RuntimeHealth {
  bool healthy = true;    // false: stalled (the process needs attention)
  bool admitting = true;  // false: low memory (new requests get 503 + Retry-After)
  nlohmann::json detail;  // {"memory": {...}, "stall": {...}}
};

// Either pointer may be null (guard not running).
RuntimeHealth runtime_health(const MemoryWatchdog* watchdog, const StallDetector* stall);

}  // namespace dsv41::runtime
