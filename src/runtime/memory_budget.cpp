#include "dsv41/runtime/memory_budget.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <set>

#include "dsv41/common/error.h"

namespace dsv41::runtime {

int64_t BudgetReport::headroom_bytes() const {
  // Signed 128-bit so that no realistic input overflows; clamp into int64.
  __int128 h = __int128(available_bytes) - __int128(required_bytes) - __int128(margin_bytes);
  if (h > std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
  if (h < std::numeric_limits<int64_t>::min()) return std::numeric_limits<int64_t>::min();
  return int64_t(h);
}

BudgetReport evaluate_budget(std::vector<BudgetItem> items, const MemoryReading& available, uint64_t margin_bytes,
                             int rank) {
  BudgetReport r;
  std::set<std::string> seen;
  uint64_t total = 0;
  for (const auto& it : items) {
    DSV_CHECK(!it.name.empty(), "memory budget: an item has no name");
    DSV_CHECK(seen.insert(it.name).second, "memory budget: item '{}' is listed twice", it.name);
    DSV_CHECK(total <= std::numeric_limits<uint64_t>::max() - it.bytes, "memory budget: total overflows at '{}'",
              it.name);
    total += it.bytes;
  }
  r.items = std::move(items);
  r.required_bytes = total;
  r.available_bytes = available.available_bytes;
  r.margin_bytes = margin_bytes;
  r.source = available.source;
  r.rank = rank;
  return r;
}

std::string format_budget_table(const BudgetReport& r) {
  size_t w = std::string_view("total required").size();
  for (const auto& it : r.items) w = std::max(w, it.name.size());
  w = std::max(w, std::string_view("margin (--memory-margin-gib)").size());
  std::string out = fmt::format("memory budget (rank {}, available = {}):\n", r.rank, r.source);
  auto row = [&](std::string_view name, uint64_t bytes) {
    out += fmt::format("  {:<{}}  {:>12.2f} GiB\n", name, w, double(bytes) / double(kGiB));
  };
  for (const auto& it : r.items) row(it.name, it.bytes);
  out += fmt::format("  {:-<{}}\n", "", w + 18);
  row("total required", r.required_bytes);
  row("margin (--memory-margin-gib)", r.margin_bytes);
  row("available", r.available_bytes);
  int64_t h = r.headroom_bytes();
  if (h >= 0) {
    out += fmt::format("  {:<{}}  {:>12.2f} GiB  OK\n", "headroom", w, double(h) / double(kGiB));
  } else {
    out += fmt::format("  {:<{}}  {:>12.2f} GiB  NOT ENOUGH: short by {}\n", "headroom", w, double(h) / double(kGiB),
                       format_gib(uint64_t(-(h + 1)) + 1));
  }
  return out;
}

void enforce_budget(const BudgetReport& r) {
  std::string table = format_budget_table(r);
  if (r.ok()) {
    spdlog::info("{}", table.substr(0, table.size() - 1));
    return;
  }
  spdlog::error("{}", table.substr(0, table.size() - 1));
  fail(
      "refusing to start: {} required + {} margin exceeds {} available ({}); lower --kv-cache-gib or other "
      "pools, free memory, or lower --memory-margin-gib\n{}",
      format_gib(r.required_bytes), format_gib(r.margin_bytes), format_gib(r.available_bytes), r.source,
      table.substr(0, table.size() - 1));
}

BudgetReport check_startup_budget(std::vector<BudgetItem> items, const MemorySource& source, uint64_t margin_bytes,
                                  int rank) {
  DSV_CHECK(bool(source), "memory budget: no memory source");
  BudgetReport r = evaluate_budget(std::move(items), source(), margin_bytes, rank);
  enforce_budget(r);
  return r;
}

}  // namespace dsv41::runtime
