// The decode-size tensor-core Lin8 (kernels/ops/lin8_tc_gemv.cu), taken by row-invariant calls
// without exact_block_sums. Its contract (ops/lin8_tc_gemv.h): (1) every output within a bound
// derived from its summation (chunks summed whole in the MMAs, then in K order) and the CPU's;
// (2) a row's bits depend on nothing but the weights and the row: not on m, its column in a tile,
// the other rows, or whether the parts of a group run together; (3) non-finite activations give
// NaN rows and a NaN weight scale NaN outputs for its 32-row group, leaving every other output's
// bits alone; (4) shapes it does not take, and calls with exact_block_sums, keep the sequential
// sums, bit-identical to the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "harness.h"
#include "lin8_weights.h"
#include "linear_inputs.h"
#include "ops/lin8_tc_gemv.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// The kernel on for each test of this file (whatever DSV41_LIN8_TC_GEMV says), restored after.
class GpuLin8TcGemv : public ::testing::Test {
 protected:
  void SetUp() override { prev_ = gpu::raw::set_lin8_tc_gemv(1); }
  void TearDown() override { gpu::raw::set_lin8_tc_gemv(prev_); }

 private:
  int prev_ = 0;
};

// A row-invariant group call over rows [r0, r0 + m) of the quantised input (outputs not set).
gpu::Lin8GroupArgs group_args(const std::vector<const Lin8Weight*>& parts, const QuantAct& qa, int64_t r0, int64_t m,
                              bool round_bf16, bool exact = false) {
  gpu::Lin8GroupArgs g = lin8_group_args(parts, qa, r0, m, round_bf16, exact);
  for (int p = 0; p < g.count; ++p) g.lin[p].row_invariant = true;
  return g;
}

// Runs the group (or each part alone when solo) into guarded, strided outputs; each part's [m][out].
std::vector<std::vector<float>> run(const std::string& what, const std::vector<const Lin8Weight*>& parts,
                                    const QuantAct& qa, int64_t r0, int64_t m, bool round_bf16, bool solo = false,
                                    bool exact = false) {
  return run_lin8_group(what, group_args(parts, qa, r0, m, round_bf16, exact), parts, m, solo);
}

int exponent_of(float pow2) { return std::ilogb(pow2); }

// (1) Each output against the CPU within the two summations' bound. With A = sum over the blocks of
// x_scale · w_scale · sum |code products| (the dot product of the magnitudes):
// - the CPU's block chains and fold: A · (2^-18 + 2 nb · 2^-24), as in lin8_tc_gemm_test;
// - the kernel: each of the in/16 MMA steps aligns its products and the running sum to the largest
//   and drops what falls below (at most 2^-22 · A a step), each chunk sum added once in fp32
//   (2^-24 · A per chunk), the final power-of-two scaling exact;
// - activation values that lie more than 2^22 below their row's and group's largest blocks are
//   rounded into f16's subnormals: at most 2^-25 each in units of 2^(s_max - 127 - c), i.e.
//   W · 2^(s_max - 127 - c - 25) with W the sum of the weight codes' magnitudes;
// - bf16 outputs: one bf16 unit (2^-7 relative) through the two roundings.
void expect_within_bound(const std::string& what, const std::vector<const Lin8Weight*>& parts,
                         const std::vector<float>& x, const QuantAct& qa, int64_t m,
                         const std::vector<std::vector<float>>& got, bool round_bf16) {
  const int64_t in = parts[0]->in, nb = in / 32, chunks = (in + 255) / 256;
  const std::vector<uint8_t> xc = qa.codes.to_host<uint8_t>(static_cast<size_t>(m * in));
  const std::vector<float> xsc = qa.scales.to_host<float>(static_cast<size_t>(m * nb));
  int64_t sum_out = 0;
  for (const Lin8Weight* w : parts) sum_out += w->out;
  const std::vector<int64_t> rows = checked_rows(m, in * sum_out);
  for (size_t p = 0; p < parts.size(); ++p) {
    const Lin8Weight& w = *parts[p];
    const std::vector<float> want = cpu_rows(w, x, rows, round_bf16);
    size_t bad = 0, equal = 0;
    double worst = 0.0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t r = rows[i];
      int row_max = -1000;
      for (int64_t b = 0; b < nb; ++b) row_max = std::max(row_max, exponent_of(xsc[r * nb + b]));
      const int c = 7 - row_max;
      for (int64_t o = 0; o < w.out; ++o) {
        int s_max = 0;
        for (int64_t b = 0; b < nb; ++b) s_max = std::max<int>(s_max, w.scales[(o / 32) * nb + b]);
        double a = 0.0, wcodes = 0.0;
        for (int64_t b = 0; b < nb; ++b) {
          double s = 0.0;
          for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
            const double wv = std::fabs(double(e4m3_to_f32(w.codes[o * in + k])));
            s += std::fabs(double(e4m3_to_f32(xc[r * in + k]))) * wv;
            wcodes += wv;
          }
          a += s * xsc[r * nb + b] * e8m0_to_f32(w.scales[(o / 32) * nb + b]);
        }
        const float g = got[p][r * w.out + o], cpu = want[i * w.out + o];
        double bound = a * (std::ldexp(1.0, -18) + 2.0 * double(nb) * std::ldexp(1.0, -24) +
                            double(in / 16) * std::ldexp(1.0, -22) + double(chunks) * std::ldexp(1.0, -24)) +
                       wcodes * std::ldexp(1.0, s_max - 127 - c - 25);
        if (round_bf16) bound += std::ldexp(1.0, -7) * std::max(std::fabs(double(g)), std::fabs(double(cpu)));
        const double err = std::fabs(double(g) - cpu);
        if (!(err <= bound)) ++bad;
        equal += g == cpu;
        if (bound > 0) worst = std::max(worst, err / bound);
      }
    }
    std::printf("  [bound]  %-60s part %zu: %zu/%zu equal to the cpu, worst error %.3f of the bound\n", what.c_str(), p,
                equal, rows.size() * w.out, worst);
    EXPECT_EQ(bad, 0u) << what << " part " << p << ": outputs outside the bound";
  }
}

void bound_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16) {
  const std::string what = describe(tag, in, outs, m) + (round_bf16 ? " bf16" : " f32");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 29 + m * 7 + outs[0] * 5 + static_cast<int64_t>(outs.size())));
  const WeightGroup wg = make_weight_group(rng, in, outs, false);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  const gpu::Lin8GroupArgs g = group_args(wg.parts, qa, 0, m, round_bf16);
  EXPECT_TRUE(gpu::raw::lin8_tc_gemv_takes(g)) << what;
  const auto got = run(what, wg.parts, qa, 0, m, round_bf16);
  expect_within_bound(what, wg.parts, x, qa, m, got, round_bf16);
  // the kernel ran: its fp32 sums are not the CPU's chains everywhere (bf16 outputs of short rows
  // can all round alike)
  const auto tc32 = run(what + " f32", wg.parts, qa, 0, m, false);
  const auto seq32 = run(what + " f32 sequential", wg.parts, qa, 0, m, false, false, true);
  size_t differ = 0;
  for (size_t p = 0; p < tc32.size(); ++p)
    for (size_t i = 0; i < tc32[p].size(); ++i) differ += tc32[p][i] != seq32[p][i];
  EXPECT_GT(differ, 0u) << what << ": identical to the sequential sums everywhere";
}

TEST_F(GpuLin8TcGemv, WithinBoundOfTheCpu) {
  for (int64_t m : {1, 3, 8, 9, 17}) {
    bound_case("ragged", 2112, {70, 9}, m, m % 2 == 1);   // 8 full chunks and a one-segment one
    bound_case("ragged", 2240, {37, 300, 5}, m, false);  // ... and a three-segment one
    bound_case("ragged", 2560, {544, 1, 100}, m, true);
  }
  const ModelConfig& c = shape_sets()[0].cfg;
  bound_case("real wq_a+wkv", c.hidden_size, {c.q_lora_rank, c.head_dim}, 1, true);
  bound_case("real wq_a+wkv", c.hidden_size, {c.q_lora_rank, c.head_dim}, 4, true);
  bound_case("real wo_b", c.o_groups * c.o_lora_rank, {c.hidden_size}, 2, true);
  bound_case("real shared w1+w3", c.hidden_size, {c.moe_intermediate_size, c.moe_intermediate_size}, 3, true);
  bound_case("real shared w2", c.moe_intermediate_size, {c.hidden_size}, 4, false);
}

// Full-range inputs whose rows and weight groups span far more than f16 holds: row 1's blocks 1
// and 2 made 2^14 and 2^30 smaller, and in every weight group one block scale 2^40 below the rest.
TEST_F(GpuLin8TcGemv, WideRowsAndWeightScalesWithinBound) {
  const int64_t in = 2048, nb = in / 32, m = 4;
  Rng rng(77);
  std::vector<std::unique_ptr<Lin8Weight>> owned;
  std::vector<const Lin8Weight*> parts;
  for (int64_t out : {96, 40}) {
    std::vector<uint8_t> scales = rng.e8m0_bytes(static_cast<size_t>(((out + 31) / 32) * nb));
    for (int64_t grp = 0; grp < (out + 31) / 32; ++grp) scales[grp * nb + 5 + grp] = 80;
    owned.push_back(std::make_unique<Lin8Weight>(in, out, rng.e4m3_bytes(static_cast<size_t>(out * in)), scales));
    parts.push_back(owned.back().get());
  }
  std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  for (int64_t k = 32; k < 64; ++k) x[in + k] = std::ldexp(x[in + k], -14);
  for (int64_t k = 64; k < 96; ++k) x[in + k] = std::ldexp(x[in + k], -30);
  QuantAct qa(x, m, in);
  for (bool bf16 : {false, true}) {
    const std::string what = std::string("wide rows and weight groups") + (bf16 ? " bf16" : " f32");
    expect_within_bound(what, parts, x, qa, m, run(what, parts, qa, 0, m, bf16), bf16);
  }
}

// (2) The same row gives the same bits alone, at any position of a larger call (another column of
// the 8-token tile, another column tile, calls whose warp split differs), and grouped or solo.
TEST_F(GpuLin8TcGemv, RowBitsIndependentOfTheBatch) {
  const ModelConfig& c = shape_sets()[0].cfg;
  struct Case {
    int64_t in;
    std::vector<int64_t> outs;
  };
  for (const Case& k : {Case{c.hidden_size, {c.q_lora_rank, c.head_dim}}, Case{2240, {37, 300, 5}},
                        Case{c.moe_intermediate_size, {c.hidden_size / 4}}}) {
    const int64_t m = 19, in = k.in;
    const std::string what = describe("batch invariance", in, k.outs, m);
    SCOPED_TRACE(what);
    Rng rng(static_cast<uint64_t>(in + 3));
    const WeightGroup wg = make_weight_group(rng, in, k.outs, false);
    QuantAct qa(rng.bf16_vec(static_cast<size_t>(m * in)), m, in);
    const auto all = run(what, wg.parts, qa, 0, m, false);
    const auto solo_parts = run(what + " parts solo", wg.parts, qa, 0, m, false, true);
    for (size_t p = 0; p < wg.parts.size(); ++p) expect_equal(what + " parts solo", solo_parts[p], all[p]);
    for (int64_t r0 : {int64_t{0}, int64_t{5}, int64_t{8}, int64_t{18}}) {
      for (int64_t n : {int64_t{1}, int64_t{4}}) {
        if (r0 + n > m) continue;
        const auto sub = run(what + " rows", wg.parts, qa, r0, n, false);
        for (size_t p = 0; p < wg.parts.size(); ++p) {
          const int64_t out = wg.parts[p]->out;
          const std::vector<float> want(all[p].begin() + r0 * out, all[p].begin() + (r0 + n) * out);
          expect_equal(what + " rows " + std::to_string(r0) + "+" + std::to_string(n), sub[p], want);
        }
      }
    }
  }
}

// (3) Non-finite inputs: a NaN activation code or a scale that is not a normal power of two (an
// infinite activation gives ActQuant8 an infinite scale) gives its row NaN outputs; a weight scale
// byte 255 (NaN) gives its 32-row group NaN outputs in every row. Every other output keeps the bits
// of the same call without them.
TEST_F(GpuLin8TcGemv, NonFiniteInputsStayInTheirRowsAndGroups) {
  const int64_t in = 2048, nb = in / 32, m = 5, out = 96;
  Rng rng(5);
  WeightGroup wg = make_weight_group(rng, in, {out}, false);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  const auto want = run("clean", wg.parts, qa, 0, m, true)[0];
  auto poke = [](void* dst, const void* src, size_t n) {
    ASSERT_EQ(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), cudaSuccess);
  };
  const uint8_t nan_code = 0x7F, nan_scale = 255;
  const float inf = std::numeric_limits<float>::infinity();
  poke(qa.codes.as<uint8_t>() + 1 * in + 100, &nan_code, 1);
  poke(qa.scales.as<float>() + 3 * nb + 2, &inf, 4);
  const auto got_x = run("non-finite rows", wg.parts, qa, 0, m, true)[0];
  QuantAct qa_clean(x, m, in);
  poke(wg.owned[0]->dscales.as<uint8_t>() + 1 * nb + 3, &nan_scale, 1);  // group 1: rows 32..63
  const auto got_w = run("NaN weight scale", wg.parts, qa_clean, 0, m, true)[0];
  size_t wrong = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const size_t i = static_cast<size_t>(r * out + o);
      const bool row_nan = r == 1 || r == 3, group_nan = o / 32 == 1;
      wrong += row_nan ? !std::isnan(got_x[i]) : std::memcmp(&got_x[i], &want[i], 4) != 0;
      wrong += group_nan ? !std::isnan(got_w[i]) : std::memcmp(&got_w[i], &want[i], 4) != 0;
    }
  EXPECT_EQ(wrong, 0u);
}

// (4) K below kLin8GemvMinK (wq_b's 1280), K that is not a whole number of 64-wide segments, and
// exact_block_sums: the sequential sums, bit-identical to the CPU on full-range codes.
TEST_F(GpuLin8TcGemv, OtherCallsKeepTheSequentialSums) {
  for (const int kind : {0, 1, 2}) {
    const bool exact = kind == 2;
    const int64_t in = kind == 0 ? 1280 : (kind == 1 ? 2080 : 2048), m = 3;
    const char* tag = kind == 0 ? "K below the minimum" : (kind == 1 ? "K % 64 != 0" : "exact_block_sums");
    const std::string what = describe(tag, in, {70, 9}, m);
    SCOPED_TRACE(what);
    Rng rng(static_cast<uint64_t>(in));
    const WeightGroup wg = make_weight_group(rng, in, {70, 9}, false);
    const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
    QuantAct qa(x, m, in);
    EXPECT_FALSE(gpu::raw::lin8_tc_gemv_takes(group_args(wg.parts, qa, 0, m, true, exact)));
    const auto got = run(what, wg.parts, qa, 0, m, true, false, exact);
    const std::vector<int64_t> rows = {0, 1, 2};
    for (size_t p = 0; p < wg.parts.size(); ++p)
      expect_equal(what + " part " + std::to_string(p), got[p], cpu_rows(*wg.parts[p], x, rows, true));
  }
}

}  // namespace
}  // namespace dsv41::test
