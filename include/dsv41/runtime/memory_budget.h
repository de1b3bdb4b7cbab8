// Start-up memory budget (both ranks): every large allocation the process is about to make, as a
// table of named byte counts, checked against the available memory minus a safety margin
// (--memory-margin-gib). A DGX Spark wedges instead of OOM-killing when unified memory runs out,
// so we refuse to start rather than find out later. The table is printed either way.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/runtime/memory_source.h"

namespace dsv41::runtime {

// One line of the budget, e.g. {"weights", 151'000'000'000}. Names are unique and non-empty.
struct BudgetItem {
  std::string name;
  uint64_t bytes = 0;
};

// The item names the engine and server report (others may be added freely).
namespace budget_item {
inline constexpr const char* kWeights = "weights";
inline constexpr const char* kSequenceStatePool = "sequence-state pool";
inline constexpr const char* kWorkspaces = "workspaces";
inline constexpr const char* kCudaGraphs = "CUDA graphs";
inline constexpr const char* kNcclBuffers = "NCCL buffers";
inline constexpr const char* kEngramCache = "Engram cache";
}  // namespace budget_item

struct BudgetReport {
  std::vector<BudgetItem> items;
  uint64_t required_bytes = 0;   // sum of items
  uint64_t available_bytes = 0;  // from the memory source
  uint64_t margin_bytes = 0;
  std::string source;            // what "available" measured
  int rank = 0;
  // available - required - margin; negative when the margin is not met.
  int64_t headroom_bytes() const;
  bool ok() const { return headroom_bytes() >= 0; }
};

// Pure arithmetic: validates the items (unique non-empty names, no overflow) and fills the report.
BudgetReport evaluate_budget(std::vector<BudgetItem> items, const MemoryReading& available, uint64_t margin_bytes,
                             int rank = 0);

// The table, one item per line, then totals and the verdict. Ends with a newline.
std::string format_budget_table(const BudgetReport& r);

// Logs the table (info when it fits, error when not) and throws dsv41::Error with the table in the
// message when the margin is not met.
void enforce_budget(const BudgetReport& r);

// Convenience for start-up: read `source`, evaluate, log, enforce. Returns the report.
BudgetReport check_startup_budget(std::vector<BudgetItem> items, const MemorySource& source, uint64_t margin_bytes,
                                  int rank = 0);

}  // namespace dsv41::runtime
