// Where "available memory" comes from. On a DGX Spark the CPU and GPU share one pool, so the
// truthful number is the kernel's MemAvailable; on a discrete GPU it is the device's free memory.
// Sources are plain callables so tests (and the watchdog) can inject falling numbers.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace dsv41::runtime {

struct MemoryReading {
  uint64_t available_bytes = 0;
  std::string source;  // what was measured, for the budget table and the logs
};

// Returns the current reading; may throw dsv41::Error when the source cannot be read.
using MemorySource = std::function<MemoryReading()>;

// Parses the `MemAvailable:` line of /proc/meminfo text (value in kB). Throws dsv41::Error naming
// `origin` when the line is missing or malformed.
uint64_t parse_meminfo_available(std::string_view meminfo_text, const std::string& origin = "/proc/meminfo");

// Reads MemAvailable from `path` (default /proc/meminfo) on every call.
MemorySource meminfo_source(std::string path = "/proc/meminfo");

// Device memory: `free_bytes` is called on every reading (e.g. a lambda around cudaMemGetInfo).
MemorySource device_memory_source(std::function<uint64_t()> free_bytes, std::string label = "device free memory");

// The start-up/watchdog default: MemAvailable when memory is unified (or no device callback is
// given), otherwise the device callback.
MemorySource default_memory_source(bool unified_memory, std::function<uint64_t()> device_free_bytes = {});

constexpr uint64_t kGiB = uint64_t{1} << 30;

// GiB (as given on the command line) to bytes; rejects negative, non-finite and absurd values.
uint64_t gib_to_bytes(double gib, std::string_view what);

// "12.34 GiB" with two decimals.
std::string format_gib(uint64_t bytes);

}  // namespace dsv41::runtime
