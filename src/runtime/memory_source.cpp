#include "dsv41/runtime/memory_source.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "dsv41/common/error.h"

namespace dsv41::runtime {

uint64_t parse_meminfo_available(std::string_view text, const std::string& origin) {
  constexpr std::string_view key = "MemAvailable:";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.substr(0, key.size()) != key) continue;
    std::string_view rest = line.substr(key.size());
    size_t i = 0;
    while (i < rest.size() && rest[i] == ' ') ++i;
    uint64_t kb = 0;
    size_t digits = 0;
    for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i, ++digits) {
      if (kb > (UINT64_MAX / 1024 - 9) / 10) fail("{}: MemAvailable value is out of range", origin);
      kb = kb * 10 + uint64_t(rest[i] - '0');
    }
    while (i < rest.size() && rest[i] == ' ') ++i;
    if (digits == 0 || rest.substr(i) != "kB")
      fail("{}: malformed MemAvailable line '{}' (expected 'MemAvailable: <n> kB')", origin, line);
    return kb * 1024;
  }
  fail("{}: no MemAvailable line (kernel older than 3.14?)", origin);
}

MemorySource meminfo_source(std::string path) {
  return [path = std::move(path)]() {
    std::ifstream in(path);
    if (!in) fail("cannot read {}", path);
    std::stringstream ss;
    ss << in.rdbuf();
    return MemoryReading{parse_meminfo_available(ss.str(), path), "MemAvailable (" + path + ")"};
  };
}

MemorySource device_memory_source(std::function<uint64_t()> free_bytes, std::string label) {
  DSV_CHECK(bool(free_bytes), "device_memory_source: no callback given");
  return [fn = std::move(free_bytes), label = std::move(label)]() { return MemoryReading{fn(), label}; };
}

MemorySource default_memory_source(bool unified_memory, std::function<uint64_t()> device_free_bytes) {
  if (unified_memory || !device_free_bytes) return meminfo_source();
  return device_memory_source(std::move(device_free_bytes));
}

uint64_t gib_to_bytes(double gib, std::string_view what) {
  // 1 PiB is far beyond any machine this serves; larger values are typos.
  if (!std::isfinite(gib) || gib < 0 || gib > 1024.0 * 1024.0)
    fail("{} must be a number of GiB between 0 and 1048576, got {}", what, gib);
  return uint64_t(std::llround(gib * double(kGiB)));
}

std::string format_gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", double(bytes) / double(kGiB)); }

}  // namespace dsv41::runtime
