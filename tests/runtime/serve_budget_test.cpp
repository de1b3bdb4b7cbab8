// The server's start-up memory budget: the items it reports (weights without the Engram tables,
// the state pool, workspaces, the Engram cache) and the refusal with the table when the margin is
// not met; the weights pass touches exactly the weight bytes.
#include <gtest/gtest.h>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"
#include "runtime/serve_startup.h"

using namespace dsv41;
using namespace dsv41::runtime;

namespace {

const std::string kModel = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model";

uint64_t item(const std::vector<BudgetItem>& items, const std::string& name) {
  for (auto& i : items)
    if (i.name == name) return i.bytes;
  ADD_FAILURE() << "no budget item " << name;
  return 0;
}

}  // namespace

TEST(ServeBudget, WeightsExcludeTheEngramTables) {
  auto ck = Checkpoint::open(kModel);
  uint64_t tables = 0;
  int n_tables = 0;
  for (const TensorInfo* t : ck->tensors())
    if (t->name.find(".engram.embed.") != std::string::npos) {
      tables += t->nbytes;
      ++n_tables;
    }
  ASSERT_GT(n_tables, 0);  // tiny-s0 keeps its tables in the folder
  EXPECT_EQ(checkpoint_weight_bytes(*ck), ck->total_bytes() - tables);
  EXPECT_EQ(preload_weights(*ck), ck->total_bytes() - tables);
}

TEST(ServeBudget, ItemsFollowTheOptions) {
  const ModelConfig c = load_model_config(kModel + "/config.json");
  ServeMemoryPlan p;
  p.weight_bytes = 10'000'000'000;
  p.world_size = 2;
  p.kv_cache_gib = 3.5;
  p.engram_cache_gib = 0.25;
  p.max_num_seqs = 8;
  p.max_num_batched_tokens = 512;
  const auto items = serve_budget_items(c, p);
  EXPECT_EQ(item(items, budget_item::kWeights), 5'000'000'000u);  // this rank's half
  EXPECT_EQ(item(items, budget_item::kSequenceStatePool), uint64_t(3.5 * double(kGiB)));
  EXPECT_EQ(item(items, budget_item::kEngramCache), kGiB / 4);
  EXPECT_EQ(item(items, budget_item::kCudaGraphs), 0u);
  EXPECT_EQ(item(items, budget_item::kNcclBuffers), 0u);
  const uint64_t ws = 8ull * uint64_t(c.vocab_size) * 4 + 16ull * 512 * uint64_t(c.hc_mult * c.hidden_size) * 4;
  EXPECT_EQ(item(items, budget_item::kWorkspaces), ws);
}

TEST(ServeBudget, RefusesToStartWithTheTableWhenTheMarginIsNotMet) {
  const ModelConfig c = load_model_config(kModel + "/config.json");
  ServeMemoryPlan p;
  p.weight_bytes = 6 * kGiB;
  p.kv_cache_gib = 2.0;
  p.max_num_seqs = 4;
  p.max_num_batched_tokens = 64;
  MemorySource ten_gib = [] { return MemoryReading{10 * kGiB, "injected MemAvailable"}; };
  // 6 + 2 + workspaces + 4 GiB margin > 10 GiB: refused, and the message is the table.
  try {
    check_startup_budget(serve_budget_items(c, p), ten_gib, 4 * kGiB);
    FAIL() << "the budget should have been refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sequence-state pool"), std::string::npos) << m;
    EXPECT_NE(m.find("weights"), std::string::npos) << m;
    EXPECT_NE(m.find("NOT ENOUGH"), std::string::npos) << m;
  }
  // With a 1 GiB margin it fits.
  EXPECT_TRUE(check_startup_budget(serve_budget_items(c, p), ten_gib, kGiB).ok());
}
