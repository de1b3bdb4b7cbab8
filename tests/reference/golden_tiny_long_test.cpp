// tiny-long against DeepSeek's reference (label `reference`, not in the CI label `cpu`).
//
// What was missing: the reference's PyTorch evaluates the mHC mixes with (1) torch.sigmoid's
// vector body (SLEEF exp, ops/vec_math.h) — now the engine's default — and (2) an fp32 GEMM
// F.linear(x[S,1024], hc_fn[24,1024]) whose threaded BLAS split K differently per call shape: the
// 96-token tiny-s0 prefill summed four parts of 256, this 300-token prefill three parts of
// 384 + 320 + 320 (bit-exact in all 1200 block-0 pre coefficients with that split, 739 with
// parts of 256). With mix_gemm_k_parts = 3 every check below passes (greedy ids, argmax at every
// position, logit tolerance, DSpark drafts; one-shot and chunked); with the default (parts of
// 256) block 3 diverges. The rule by which the BLAS picks the split for other shapes is unknown,
// so the engine does not pick 3 by itself: these stay out of CI until that rule is known.
#include "../model/golden_check.h"

namespace {
constexpr int64_t kTinyLongMixParts = 3;
}  // namespace

TEST(GoldenTinyLong, OneShot) { check_fixture("tiny-long", 0, kTinyLongMixParts); }
TEST(GoldenTinyLong, Chunks7) { check_fixture("tiny-long", 7, kTinyLongMixParts); }
TEST(GoldenTinyLong, Chunks64) { check_fixture("tiny-long", 64, kTinyLongMixParts); }
