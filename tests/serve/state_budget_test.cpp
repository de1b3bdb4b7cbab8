// State-memory arithmetic against MODEL.md §5.7 (released config) and the block pool.
#include <gtest/gtest.h>

#include "sched/state_budget.h"
#include "test_model.h"

using namespace dsv41;

namespace {

ModelConfig released_config() {
  ModelConfig c;
  c.num_hidden_layers = 40;
  c.num_nextn_predict_layers = 3;
  c.head_dim = 512;
  c.index_head_dim = 128;
  c.sliding_window = 128;
  c.compress_ratios.assign(43, 1);
  for (int L = 2; L < 20; ++L) c.compress_ratios[L] = 2;
  c.compress_ratios[0] = c.compress_ratios[1] = 0;
  c.compress_ratios[40] = c.compress_ratios[41] = c.compress_ratios[42] = 0;
  c.kv_source_layer_ids = {2, 8, 14, 20};
  c.engram_max_ngram_size = 4;
  return c;
}

}  // namespace

TEST(StateBudget, ReleasedModelMatchesModelMd57) {
  const auto b = sched::state_bytes(released_config());
  EXPECT_EQ(b.packed_per_token, 890);  // 3 x (288 + 68) / 2 + (288 + 68)
  EXPECT_EQ(b.bf16_per_token, 3200);
  // 40 x 128 x 528 window rings + 3 x 128 x 528 DSpark rings + 3 x (2 x 2 x 512 x 4) carries + 3 ids
  EXPECT_EQ(b.packed_fixed, 40 * 128 * 528 + 3 * 128 * 528 + 3 * 2 * 2 * 512 * 4 + 12);
  EXPECT_EQ(b.bf16_fixed, 43 * 128 * 1024 + 3 * 2 * 2 * 512 * 4 + 12);
}

TEST(StateBudget, TinyConfigFromItsSizes) {
  const auto b = sched::state_bytes(test_support::tiny_config());
  // head_dim 64: entry 32 + 4; index_head_dim 64: key 32 + 2; sources: layer 1 (ratio 2), 3 (ratio 1)
  EXPECT_EQ(b.packed_per_token, 70 / 2 + 70);
}
