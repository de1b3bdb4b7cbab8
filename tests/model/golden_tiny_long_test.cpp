// tiny-long against DeepSeek's reference (seed 1, a 300-token prompt, 16 decode steps): greedy ids,
// argmax at every position, logit tolerance and DSpark drafts, one-shot and chunked, with the
// engine's defaults. Its 300-row prefill is where the reference's BLAS summed the mHC mixes GEMM in
// its blocked order (dsv41/model/mix_gemm_parts.h), unlike tiny-s0's 96 rows.
#include "golden_check.h"

TEST(GoldenTinyLong, OneShot) { check_fixture("tiny-long", 0); }
TEST(GoldenTinyLong, Chunks7) { check_fixture("tiny-long", 7); }
TEST(GoldenTinyLong, Chunks64) { check_fixture("tiny-long", 64); }
