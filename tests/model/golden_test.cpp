// Golden checks on tiny-s0 (runs in CI; tiny-long is golden_tiny_long_test.cpp).
#include "golden_check.h"

TEST(GoldenTinyS0, OneShot) { check_fixture("tiny-s0", 0); }
TEST(GoldenTinyS0, Chunks7) { check_fixture("tiny-s0", 7); }
TEST(GoldenTinyS0, Chunks64) { check_fixture("tiny-s0", 64); }
// The reference's decode-time index-key alias (MODEL.md §5.4) is the default; the corrected
// reading leaves prefill untouched but changes decode (the golden decode follows the alias).
TEST(GoldenTinyS0, DecodeIndexKeyAliasIsTheDefault) {
  const std::string dir = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0";
  const Golden g = load_golden(dir);
  const RunResult corrected = run_model(dir, g, 0, true);
  const RunResult alias = run_model(dir, g, 0, false);
  EXPECT_EQ(corrected.prefill, alias.prefill);
  EXPECT_EQ(alias.greedy, g.greedy);
  EXPECT_NE(corrected.greedy, g.greedy);
  EXPECT_GT(worst_rel(corrected.decode, g.decode, g.V), 0.05);
}
