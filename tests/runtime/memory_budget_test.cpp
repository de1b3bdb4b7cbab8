#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dsv41/common/error.h"
#include "dsv41/runtime/memory_budget.h"

using namespace dsv41::runtime;

namespace {

const char* kMeminfo =
    "MemTotal:       131072000 kB\n"
    "MemFree:         2000000 kB\n"
    "MemAvailable:   98765432 kB\n"
    "Buffers:          123456 kB\n";

std::vector<BudgetItem> spark_items() {
  return {{budget_item::kWeights, 80 * kGiB},
          {budget_item::kSequenceStatePool, 12 * kGiB},
          {budget_item::kWorkspaces, 3 * kGiB / 2},
          {budget_item::kCudaGraphs, kGiB / 4},
          {budget_item::kNcclBuffers, kGiB / 2},
          {budget_item::kEngramCache, 2 * kGiB}};
}

}  // namespace

TEST(MemInfo, ParsesMemAvailableInKiB) {
  EXPECT_EQ(parse_meminfo_available(kMeminfo), uint64_t{98765432} * 1024);
}

TEST(MemInfo, MissingOrMalformedLineIsAnError) {
  EXPECT_THROW(parse_meminfo_available("MemTotal: 1 kB\nMemFree: 2 kB\n"), dsv41::Error);
  EXPECT_THROW(parse_meminfo_available("MemAvailable:  12 MB\n"), dsv41::Error);
  EXPECT_THROW(parse_meminfo_available("MemAvailable:   kB\n"), dsv41::Error);
  EXPECT_THROW(parse_meminfo_available("MemAvailable: 99999999999999999999999 kB\n"), dsv41::Error);
}

TEST(MemInfo, SourceReadsTheFileOnEveryCall) {
  auto path = std::filesystem::temp_directory_path() / ("dsv41_meminfo_" + std::to_string(::getpid()));
  {
    std::ofstream(path) << "MemAvailable: 1000 kB\n";
  }
  auto src = meminfo_source(path.string());
  EXPECT_EQ(src().available_bytes, 1000u * 1024);
  {
    std::ofstream(path) << "MemTotal: 5 kB\nMemAvailable: 500 kB\n";
  }
  MemoryReading r = src();
  EXPECT_EQ(r.available_bytes, 500u * 1024);
  EXPECT_NE(r.source.find(path.string()), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_THROW(src(), dsv41::Error);
}

TEST(MemInfo, RealProcMeminfoIsReadable) {
  MemoryReading r = meminfo_source()();
  EXPECT_GT(r.available_bytes, 0u);
}

TEST(MemInfo, DefaultSourcePicksDeviceOnlyForDiscreteMemory) {
  auto dev = [] { return uint64_t{7} * kGiB; };
  EXPECT_EQ(default_memory_source(false, dev)().available_bytes, 7 * kGiB);
  EXPECT_NE(default_memory_source(true, dev)().source.find("MemAvailable"), std::string::npos);
}

TEST(MemoryBudget, ArithmeticAndVerdict) {
  auto items = spark_items();
  uint64_t sum = 0;
  for (auto& i : items) sum += i.bytes;
  // available = sum + margin + 1 GiB -> OK with exactly 1 GiB headroom.
  auto r = evaluate_budget(items, {sum + 4 * kGiB + kGiB, "test"}, gib_to_bytes(4, "margin"), 1);
  EXPECT_EQ(r.required_bytes, sum);
  EXPECT_EQ(r.headroom_bytes(), int64_t(kGiB));
  EXPECT_TRUE(r.ok());
  EXPECT_NO_THROW(enforce_budget(r));
  // Exactly at the margin is still fine; one byte less is not.
  EXPECT_TRUE(evaluate_budget(items, {sum + 4 * kGiB, "t"}, 4 * kGiB).ok());
  auto short1 = evaluate_budget(items, {sum + 4 * kGiB - 1, "t"}, 4 * kGiB);
  EXPECT_FALSE(short1.ok());
  EXPECT_EQ(short1.headroom_bytes(), -1);
}

TEST(MemoryBudget, TableListsEveryItemAndTotals) {
  auto r = evaluate_budget(spark_items(), {120 * kGiB, "MemAvailable (/proc/meminfo)"}, 4 * kGiB, 0);
  std::string t = format_budget_table(r);
  for (const char* name : {"weights", "sequence-state pool", "workspaces", "CUDA graphs", "NCCL buffers",
                           "Engram cache", "total required", "margin (--memory-margin-gib)", "available"})
    EXPECT_NE(t.find(name), std::string::npos) << name << "\n" << t;
  // 80 + 12 + 1.5 + 0.25 + 0.5 + 2 = 96.25 GiB; headroom 120 - 96.25 - 4 = 19.75 GiB
  EXPECT_NE(t.find("96.25 GiB"), std::string::npos) << t;
  EXPECT_NE(t.find("19.75 GiB  OK"), std::string::npos) << t;
  EXPECT_NE(t.find("rank 0"), std::string::npos);
}

TEST(MemoryBudget, RefusesWithTableWhenMarginNotMet) {
  // 96.25 required + 4 margin = 100.25 > 98 available: short by 2.25 GiB.
  auto r = evaluate_budget(spark_items(), {98 * kGiB, "MemAvailable (/proc/meminfo)"}, 4 * kGiB);
  EXPECT_FALSE(r.ok());
  try {
    enforce_budget(r);
    FAIL() << "enforce_budget accepted a budget over the margin";
  } catch (const dsv41::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("refusing to start"), std::string::npos) << m;
    EXPECT_NE(m.find("short by 2.25 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("weights"), std::string::npos) << m;
    EXPECT_NE(m.find("98.00 GiB"), std::string::npos) << m;
  }
}

TEST(MemoryBudget, StartupCheckUsesTheInjectedSource) {
  int calls = 0;
  MemorySource src = [&] {
    ++calls;
    return MemoryReading{50 * kGiB, "fake"};
  };
  EXPECT_NO_THROW(check_startup_budget({{"weights", 40 * kGiB}}, src, 4 * kGiB));
  EXPECT_THROW(check_startup_budget({{"weights", 47 * kGiB}}, src, 4 * kGiB), dsv41::Error);
  EXPECT_EQ(calls, 2);
}

TEST(MemoryBudget, RejectsBadItemsAndMargins) {
  EXPECT_THROW(evaluate_budget({{"a", 1}, {"a", 2}}, {10, "t"}, 0), dsv41::Error);
  EXPECT_THROW(evaluate_budget({{"", 1}}, {10, "t"}, 0), dsv41::Error);
  EXPECT_THROW(evaluate_budget({{"a", UINT64_MAX}, {"b", 1}}, {10, "t"}, 0), dsv41::Error);
  EXPECT_THROW(gib_to_bytes(-1, "--memory-margin-gib"), dsv41::Error);
  EXPECT_THROW(gib_to_bytes(std::nan(""), "--memory-margin-gib"), dsv41::Error);
  EXPECT_EQ(gib_to_bytes(0.5, "x"), kGiB / 2);
}
