// The tensor-core Lin8 GEMM (kernels/ops/lin8_tc_gemm.cu), taken by calls without exact_block_sums
// from kLin8TcMinRows rows. Its contract (ops/tc_block.cuh): (1) bit-identical to the CPU reference
// Lin8 when every block's exact sum needs at most 24 bits; (2) on full-range codes within a bound
// derived from the summation error of the two ways of adding a block; (3) one output's bits do not
// depend on the row count, the CTA tile, the token tile a row lands in or the other parts of a
// group; (4) calls with exact_block_sums keep the sequential kernels, bit-identical to the CPU;
// (5) the scaled path (f16 rows that carry the block scales) with its blocks folded one by one
// gives the same bits; (6) its default, whole-K sums for the weight groups that allow them, stays
// within its own bound and keeps (3).
// Each again on K of whole blocks that ends in a partial 128-byte stage after full ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "gemm_dispatch.h"
#include "harness.h"
#include "lin8_weights.h"
#include "linear_inputs.h"
#include "model/linears.h"
#include "ops/lin8_tc_gemm.h"
#include "ops/scaled_rows.h"
#include "ops/lin_gemm.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;
using Weight = Lin8Weight;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Sets the tensor-core GEMM's row threshold and tile while in scope.
using TcSettings = ScopedGemmDispatch<&gpu::raw::set_lin8_tc_min_rows, &gpu::raw::set_lin8_tc_tile>;

// The tensor-core tiles that fit this device's shared memory for inputs of `in`: both on the H200,
// the 64 x 64 tile alone under GB10's 99 KB (the suites' second run). Never none: the engine's
// prefill linears need one. TilesBeyondTheDeviceAreRefused checks the others are refused.
std::vector<int> tc_tiles(int64_t in) {
  std::vector<int> tiles;
  for (int tile = 1; tile <= gpu::raw::kLin8TcTiles; ++tile)
    if (gpu::raw::lin8_tc_gemm_tile_fits(tile, in)) tiles.push_back(tile);
  EXPECT_FALSE(tiles.empty()) << "no tensor-core tile fits this device for K = " << in;
  return tiles;
}


std::vector<float> narrow_range_x(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round((rng.g() & 1 ? -1.0f : 1.0f) * rng.uniform(1.0f, 4.0f));
  return v;
}

// Full-range bf16 inputs of m rows, row 3's second 32-wide block (K 32..63) made 2^14 smaller: its
// block scales span more than f16 rows can hold exactly (ops/scaled_rows.h), so the scaled path
// leaves it to the codes (block_fold) or rounds it into f16 (the whole-K default).
std::vector<float> wide_row_inputs(Rng& rng, int64_t m, int64_t in) {
  std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  for (int64_t k = 32; k < 64 && k < in; ++k) x[static_cast<size_t>(3 * in + k)] = std::ldexp(x[static_cast<size_t>(3 * in + k)], -14);
  return x;
}

// Runs lin8_group (or one lin8 per part when solo) over rows [r0, r0 + m) of the quantised input;
// returns each part's [m][out] outputs (written into guarded, strided buffers that are checked).
// rows16: the scaled path's scratch (Lin8Args::rows16), or none.
// block_fold: the scaled path's numerics (Lin8Args::block_fold).
std::vector<std::vector<float>> run(const std::string& what, const std::vector<const Weight*>& parts, const QuantAct& qa,
                                    int64_t r0, int64_t m, bool round_bf16, bool exact, bool solo = false,
                                    const DeviceBuffer* rows16 = nullptr, bool block_fold = true) {
  gpu::Lin8GroupArgs g = lin8_group_args(parts, qa, r0, m, round_bf16, exact);
  for (int p = 0; p < g.count; ++p) {
    g.lin[p].block_fold = block_fold;
    if (rows16) {
      g.lin[p].rows16 = rows16->get();
      g.lin[p].rows16_bytes = static_cast<int64_t>(rows16->bytes());
    }
  }
  return run_lin8_group(what, g, parts, m, solo);
}




// (1) block sums that fit in 24 bits: bit-identical to the CPU reference, every tile.
void exact_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16) {
  const std::string what = describe(tag, in, outs, m) + (round_bf16 ? " bf16" : " f32");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 13 + m * 5 + outs[0] * 3 + static_cast<int64_t>(outs.size())));
  const WeightGroup wg = make_weight_group(rng, in, outs, true);
  const std::vector<const Weight*>& parts = wg.parts;
  const std::vector<float> x = narrow_range_x(rng, static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  const std::vector<int64_t> rows = checked_rows(m, in * wg.sum_out);
  std::vector<std::vector<float>> want;
  for (const Weight* w : parts) want.push_back(cpu_rows(*w, x, rows, round_bf16));
  for (int tile : tc_tiles(in)) {
    TcSettings tc(1, tile);
    const std::string wt = what + " tile " + std::to_string(tile);
    const auto got = run(wt, parts, qa, 0, m, round_bf16, false);
    for (size_t p = 0; p < parts.size(); ++p)
      expect_equal(wt + " part " + std::to_string(p) + " vs cpu", pick_rows(got[p], outs[p], rows), want[p]);
  }
}

TEST(GpuLin8TcGemm, BitExactWhenBlockSumsFit) {
  for (int64_t m : {1, 17, 64, 129, 300}) {
    exact_case("ragged", 96, {70, 9}, m, true);  // K of 3 blocks: one partial stage
    exact_case("ragged", 512, {37, 300, 5}, m, false);
    exact_case("ragged", 1280, {544, 1, 100}, m, m % 2 == 0);
    exact_case("ragged", 5120, {96, 33}, m, true);
  }
  const ModelConfig& c = shape_sets()[0].cfg;
  exact_case("real wq_a+wkv", c.hidden_size, {c.q_lora_rank, c.head_dim}, 300, true);
  exact_case("real wo_b", c.o_groups * c.o_lora_rank, {c.hidden_size}, 200, true);
}

// (2) full-range codes: every output within the bound of the two summations. Per block, the CPU's
// sequential chain of 32 fp32 additions is off the exact sum by at most 31 * 2^-24 * sum|products|,
// the tensor core's by a few roundings of that size; 2^-18 * sum|products| covers both. Scaled by
// x_scale * w_scale and summed over the blocks that gives A * 2^-18, A = sum over blocks of
// x_scale * w_scale * sum|products|; each side's nb fold roundings add at most nb * 2^-24 * A. bf16
// outputs may further differ by one bf16 unit (2^-7 relative) through the two roundings.
// The whole-K form (whole_k) has no fold but 2nb MMA steps into one fp32 accumulator, each
// aligning 16 exact products and the running sum to the largest and dropping what falls below:
// at most 2^-22 * A a step (a few bits of slack over fp32's 2^-24); its f16 rows round the blocks of
// a wide row that lie more than 2^12 below the row's largest (ScaledRowsArgs::round_wide), each value
// by at most 2^-25 of the row's f16 scale 2^c: W * 2^(-25 - c), W = sum over blocks of
// w_scale * sum|codes of w|. info: the rows' exponents c (whole_k only).
void expect_within_bound(const std::string& what, const std::vector<const Weight*>& parts, const std::vector<float>& x,
                         const QuantAct& qa, int64_t m, const std::vector<std::vector<float>>& got, bool round_bf16,
                         bool whole_k = false, const std::vector<int32_t>& info = {}) {
  const int64_t in = parts[0]->in, nb = in / 32;
  const std::vector<uint8_t> xc = qa.codes.to_host<uint8_t>(static_cast<size_t>(m * in));
  const std::vector<float> xsc = qa.scales.to_host<float>(static_cast<size_t>(m * nb));
  int64_t sum_out = 0;
  for (const Weight* w : parts) sum_out += w->out;
  const std::vector<int64_t> rows = checked_rows(m, in * sum_out);
  for (size_t p = 0; p < parts.size(); ++p) {
    const Weight& w = *parts[p];
    const std::vector<float> want = cpu_rows(w, x, rows, round_bf16);
    size_t bad = 0, equal = 0;
    double worst = 0.0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t r = rows[i];
      for (int64_t o = 0; o < w.out; ++o) {
        double a = 0.0, wsum = 0.0;
        for (int64_t b = 0; b < nb; ++b) {
          double s = 0.0, sw = 0.0;
          for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
            const double wv = std::fabs(double(e4m3_to_f32(w.codes[o * in + k])));
            s += std::fabs(double(e4m3_to_f32(xc[r * in + k]))) * wv;
            sw += wv;
          }
          const double ws = e8m0_to_f32(w.scales[(o / 32) * nb + b]);
          a += s * xsc[r * nb + b] * ws;
          wsum += sw * ws;
        }
        const float g = got[p][r * w.out + o], c = want[i * w.out + o];
        double bound = a * (std::ldexp(1.0, -18) + 2.0 * double(nb) * std::ldexp(1.0, -24));
        if (whole_k) bound += a * 2.0 * double(nb) * std::ldexp(1.0, -22) + wsum * std::ldexp(1.0, -25 - info[r]);
        if (round_bf16) bound += std::ldexp(1.0, -7) * std::max(std::fabs(double(g)), std::fabs(double(c)));
        const double err = std::fabs(double(g) - c);
        if (!(err <= bound)) ++bad;
        equal += g == c;
        if (bound > 0) worst = std::max(worst, err / bound);
      }
    }
    std::printf("  [bound]  %-60s part %zu: %zu/%zu equal to the cpu, worst error %.3f of the bound\n", what.c_str(), p,
                equal, rows.size() * w.out, worst);
    EXPECT_EQ(bad, 0u) << what << " part " << p << ": outputs outside the bound";
  }
}

void bound_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16, int tile) {
  const std::string what = describe(tag, in, outs, m) + (round_bf16 ? " bf16" : " f32") + " tile " + std::to_string(tile);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 17 + m * 3 + outs[0] + tile));
  const WeightGroup wg = make_weight_group(rng, in, outs, false);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  TcSettings tc(1, tile);
  expect_within_bound(what, wg.parts, x, qa, m, run(what, wg.parts, qa, 0, m, round_bf16, false), round_bf16);
}

TEST(GpuLin8TcGemm, FullRangeWithinBound) {
  for (int tile : tc_tiles(96)) bound_case("ragged", 96, {70, 9}, 129, false, tile);
  for (int tile : tc_tiles(1280)) bound_case("ragged", 1280, {544, 1, 100}, 300, true, tile);
  for (int tile : tc_tiles(5120)) bound_case("ragged", 5120, {96, 33}, 64, false, tile);
  const ModelConfig& c = shape_sets()[0].cfg;
  bound_case("real wq_b", c.q_lora_rank, {c.num_attention_heads * c.head_dim}, 256, true, 0);
  bound_case("real shared w2", c.moe_intermediate_size, {c.hidden_size}, 300, false, 0);
}

// (3) full-range codes: one row's outputs are the same bits from a group of m rows on the first
// tile, every other tile, separate calls per part, calls of 64 rows starting at a row inside a token
// tile, and single-row calls.
// With whole_k the calls take the scaled path in its default numerics (block_fold off), row 3 made
// wide enough (blocks 2^14 apart) that its f16 row is rounded: its neighbours must not notice.
void invariance_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m,
                     bool whole_k = false) {
  const std::string what = describe(tag, in, outs, m) + (whole_k ? " whole-K" : "");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 19 + m + outs[0] * 5));
  const WeightGroup wg = make_weight_group(rng, in, outs, false);
  const std::vector<const Weight*>& parts = wg.parts;
  const std::vector<float> x = whole_k ? wide_row_inputs(rng, m, in) : rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  const DeviceBuffer rows16(static_cast<size_t>(gpu::lin8_rows16_bytes(m, in)));
  const DeviceBuffer* r16 = whole_k ? &rows16 : nullptr;
  auto call = [&](const std::string& w, int64_t r0, int64_t n, bool solo = false) {
    return run(w, parts, qa, r0, n, false, false, solo, r16, !whole_k);
  };
  std::vector<std::vector<float>> ref;
  const int64_t sub = std::min<int64_t>(64, m - 37);  // a call over rows 37 .. 37 + sub - 1
  const std::vector<int> tiles = tc_tiles(in);
  ASSERT_FALSE(tiles.empty());
  const int first = tiles.front();
  {
    TcSettings tc(1, first);
    ref = call(what + " tile " + std::to_string(first), 0, m);
  }
  auto same_rows = [&](const std::string& label, const std::vector<std::vector<float>>& got, int64_t r0, int64_t n) {
    for (size_t p = 0; p < parts.size(); ++p) {
      const int64_t o = parts[p]->out;
      const std::vector<float> want(ref[p].begin() + r0 * o, ref[p].begin() + (r0 + n) * o);
      expect_equal(what + " " + label + " part " + std::to_string(p), got[p], want);
    }
  };
  for (size_t i = 1; i < tiles.size(); ++i) {
    TcSettings tc(1, tiles[i]);
    const std::string t = " tile " + std::to_string(tiles[i]);
    same_rows("all rows" + t, call(what, 0, m), 0, m);
    same_rows("rows from 37" + t, call(what, 37, sub), 37, sub);
  }
  {
    TcSettings tc(1, first);
    same_rows("solo calls", call(what, 0, m, true), 0, m);
    same_rows("rows from 37", call(what, 37, sub), 37, sub);
    for (int64_t r : {int64_t{0}, int64_t{5}, m - 1}) same_rows("row " + std::to_string(r), call(what, r, 1), r, 1);
  }
  {
    TcSettings tc(1, 0);  // the automatic tile
    same_rows("automatic tile", call(what, 0, m), 0, m);
  }
  if (whole_k) {
    const std::vector<int32_t> info =
        rows16.to_host<int32_t>(static_cast<size_t>(m), static_cast<size_t>(gpu::lin8_rows16_info_offset(m, in) / 4));
    EXPECT_NE(info[3], gpu::kScaledRowUnscaled) << what << ": row 3 should be rounded into f16, not left to the codes";
  }
}

TEST(GpuLin8TcGemm, BatchTileAndGroupInvariant) {
  invariance_case("ragged", 1280, {544, 1, 100}, 300);
  invariance_case("ragged", 96, {70, 9}, 130);
  const ModelConfig& c = shape_sets()[0].cfg;
  invariance_case("real shared w1+w3", c.hidden_size, {c.moe_intermediate_size, c.moe_intermediate_size}, 160);
}

// (5) the scaled path (Lin8Args::rows16: the input as f16 rows that carry their block scales, one
// fma per block fold) gives the codes path's bits on every tile, over several token tiles, a K that
// ends in a partial stage, groups and solo calls, with row 3's block scales too far apart for it
// (2^14): its token tile takes the codes path in the same call.
void scaled_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16) {
  const std::string what = describe(tag, in, outs, m) + (round_bf16 ? " bf16" : " f32") + " scaled";
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 23 + m * 7 + outs[0]));
  const WeightGroup wg = make_weight_group(rng, in, outs, false);
  const std::vector<const Weight*>& parts = wg.parts;
  const std::vector<float> x = wide_row_inputs(rng, m, in);
  QuantAct qa(x, m, in);
  const DeviceBuffer rows16(static_cast<size_t>(gpu::lin8_rows16_bytes(m, in)));
  for (int tile : tc_tiles(in)) {
    TcSettings tc(1, tile);
    const std::string t = what + " tile " + std::to_string(tile);
    const auto codes = run(t + " codes", parts, qa, 0, m, round_bf16, false);
    const auto scaled = run(t, parts, qa, 0, m, round_bf16, false, false, &rows16);
    const auto solo = run(t + " solo", parts, qa, 0, m, round_bf16, false, true, &rows16);
    for (size_t p = 0; p < parts.size(); ++p) {
      expect_equal(t + " part " + std::to_string(p) + " vs codes path", scaled[p], codes[p]);
      expect_equal(t + " solo part " + std::to_string(p) + " vs codes path", solo[p], codes[p]);
    }
  }
  const std::vector<int32_t> info =
      rows16.to_host<int32_t>(static_cast<size_t>(m), static_cast<size_t>(gpu::lin8_rows16_info_offset(m, in) / 4));
  if (in >= 64) EXPECT_EQ(info[3], gpu::kScaledRowUnscaled) << what << ": row 3's scales span 2^14";
  EXPECT_NE(info[0], gpu::kScaledRowUnscaled) << what << ": row 0 should have f16 rows";
}

TEST(GpuLin8TcGemm, ScaledPathSameBits) {
  scaled_case("ragged", 96, {70, 9}, 300, true);  // K of 3 blocks: one partial stage
  scaled_case("ragged", 1280, {544, 1, 100}, 300, false);
  const ModelConfig& c = shape_sets()[0].cfg;
  scaled_case("real wo_b", c.o_groups * c.o_lora_rank, {c.hidden_size}, 200, true);
}

// (6) the scaled path's default numerics (Lin8Args::block_fold off): the whole K summed in the MMAs
// for the 32-row weight groups whose block scales lie within 2^21 of each other, per-block folds
// for the others. Part 0's scale groups are set to the edges: group 1 spans exactly 2^21 (the
// widened weights reach 2^-14 and 2^7 times their codes), group 2 spans 2^22 and group 3 holds a
// scale byte 0 (both fold). Every output within the whole-K bound of the CPU (row 3, wide, rounded
// into f16 included); the folding groups give the block fold's bits on every other row; the
// whole-K groups differ from them somewhere (the form ran); and the bits are the same over tiles,
// solo calls, row subsets and single rows (invariance_case).
void whole_k_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16) {
  const std::string what = describe(tag, in, outs, m) + (round_bf16 ? " bf16" : " f32") + " whole-K";
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 29 + m * 3 + outs[0]));
  const int64_t nb = in / 32;
  std::vector<std::unique_ptr<Weight>> owned;
  std::vector<const Weight*> parts;
  for (size_t p = 0; p < outs.size(); ++p) {
    std::vector<uint8_t> scales = rng.e8m0_bytes(static_cast<size_t>(((outs[p] + 31) / 32) * nb));
    const int64_t groups = (outs[p] + 31) / 32;
    if (p == 0) {
      auto group = [&](int64_t gi) { return scales.begin() + gi * nb; };
      if (groups > 1) {
        for (int64_t b = 0; b < nb; ++b) group(1)[b] = static_cast<uint8_t>(100 + rng.below(22));
        group(1)[0] = 100, group(1)[nb - 1] = 121;
      }
      if (groups > 2) {
        for (int64_t b = 0; b < nb; ++b) group(2)[b] = static_cast<uint8_t>(100 + rng.below(22));
        group(2)[0] = 100, group(2)[nb - 1] = 122;
      }
      if (groups > 3) group(3)[nb / 2] = 0;
    }
    owned.push_back(std::make_unique<Weight>(in, outs[p], rng.e4m3_bytes(static_cast<size_t>(in * outs[p])), scales));
    parts.push_back(owned.back().get());
  }
  const std::vector<float> x = wide_row_inputs(rng, m, in);
  QuantAct qa(x, m, in);
  const DeviceBuffer rows16(static_cast<size_t>(gpu::lin8_rows16_bytes(m, in)));
  for (int tile : tc_tiles(in)) {
    TcSettings tc(1, tile);
    const std::string t = what + " tile " + std::to_string(tile);
    const auto folded = run(t + " block fold", parts, qa, 0, m, round_bf16, false, false, &rows16, true);
    const auto got = run(t, parts, qa, 0, m, round_bf16, false, false, &rows16, false);
    const std::vector<int32_t> info =
        rows16.to_host<int32_t>(static_cast<size_t>(m), static_cast<size_t>(gpu::lin8_rows16_info_offset(m, in) / 4));
    for (int64_t r = 0; r < m; ++r)
      ASSERT_NE(info[r], gpu::kScaledRowUnscaled) << t << ": row " << r << " has no f16 row";
    expect_within_bound(t, parts, x, qa, m, got, round_bf16, true, info);
    size_t differ = 0, edge_differ = 0, folded_same = 0, folded_total = 0;
    for (size_t p = 0; p < parts.size(); ++p)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t o = 0; o < outs[p]; ++o) {
          const size_t i = static_cast<size_t>(r * outs[p] + o);
          const bool same = std::memcmp(&got[p][i], &folded[p][i], 4) == 0;
          const int64_t grp = o / 32;
          if (p == 0 && (grp == 2 || grp == 3)) {
            if (r == 3) continue;  // rounded into f16 here, left to the codes path under block_fold
            ++folded_total;
            folded_same += same;
          } else {
            differ += !same;
            if (p == 0 && grp == 1) edge_differ += !same;
          }
        }
    EXPECT_EQ(folded_same, folded_total) << t << ": the groups outside the whole-K range must fold per block";
    if (!round_bf16 && nb >= 8) {
      EXPECT_GT(differ, 0u) << t << ": whole-K outputs all equal to the block fold's";
      EXPECT_GT(edge_differ, 0u) << t << ": the group spanning 2^21 did not take the whole-K form";
    }
  }
}

TEST(GpuLin8TcGemm, WholeKWithinBoundAndFallbacks) {
  whole_k_case("ragged", 96, {130, 9}, 130, true);  // K of 3 blocks: one partial stage
  whole_k_case("ragged", 1280, {544, 1, 100}, 300, false);
  const ModelConfig& c = shape_sets()[0].cfg;
  whole_k_case("real wo_b", c.o_groups * c.o_lora_rank, {c.hidden_size}, 200, false);
}

TEST(GpuLin8TcGemm, WholeKBatchTileAndGroupInvariant) {
  invariance_case("ragged", 1280, {544, 1, 100}, 300, true);
  invariance_case("ragged", 96, {70, 9}, 130, true);
  invariance_case("partial stage", 2144, {96, 64}, 200, true);
}

// (4) exact_block_sums keeps the sequential kernels (bit-identical to the CPU on full-range codes),
// while the same call without it takes the tensor-core GEMM from the row threshold on (which then
// differs from the sequential sums somewhere on such codes); a huge threshold turns it off.
TEST(GpuLin8TcGemm, ExactBlockSumsAndDispatch) {
  TcSettings defaults(gpu::raw::kLin8TcMinRows, 0);
  const ModelConfig& c = shape_sets()[0].cfg;
  const int64_t in = c.hidden_size, m = 256;
  Rng rng(77);
  const auto w = make_weight(rng, in, c.q_lora_rank, false);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  const std::vector<int64_t> rows = checked_rows(m, in * w->out);
  const auto exact = run("exact", {w.get()}, qa, 0, m, false, true);
  expect_equal("exact_block_sums vs cpu", pick_rows(exact[0], w->out, rows), cpu_rows(*w, x, rows, false));
  const auto tc = run("tensor core", {w.get()}, qa, 0, m, false, false);
  size_t differ = 0;
  for (size_t i = 0; i < tc[0].size(); ++i) differ += tc[0][i] != exact[0][i];
  std::printf("  [dispatch] %zu of %zu outputs differ between the tensor-core and the sequential sums\n", differ, tc[0].size());
  EXPECT_GT(differ, 0u) << "the call without exact_block_sums did not take the tensor-core GEMM";
  {
    TcSettings off(kNever, 0);
    expect_equal("threshold off vs exact", run("off", {w.get()}, qa, 0, m, false, false)[0], exact[0]);
  }
  // below the threshold the call keeps the sequential kernels
  const int64_t below = gpu::raw::kLin8TcMinRows - 1;
  if (below >= 1) {
    const auto small = run("below threshold", {w.get()}, qa, 0, below, false, false);
    const std::vector<float> want(exact[0].begin(), exact[0].begin() + below * w->out);
    expect_equal("below threshold vs exact", small[0], want);
  }
  gpu::Lin8GroupArgs g;
  g.count = 1;
  g.lin[0].w = {w->dcodes.as<uint8_t>(), w->dscales.as<uint8_t>(), in, 32};
  g.lin[0].x_codes = qa.codes.as<uint8_t>();
  g.lin[0].x_scales = qa.scales.as<float>();
  g.lin[0].m = gpu::raw::kLin8TcMinRows;
  EXPECT_TRUE(gpu::raw::lin8_tc_gemm_supported(g));
  {
    TcSettings forced(gpu::raw::kLin8TcMinRows, 2);  // at the threshold the tensor-core GEMM takes the call
    EXPECT_TRUE(gpu::raw::lin8_gemm_takes(g));
    g.lin[0].exact_block_sums = true;  // ...but never one that asks for the sequential sums
    const int64_t prev = gpu::raw::set_lin8_gemm_min_rows(kNever);
    EXPECT_FALSE(gpu::raw::lin8_gemm_takes(g));
    gpu::raw::set_lin8_gemm_min_rows(prev);
    g.lin[0].exact_block_sums = false;
  }
  g.lin[0].x_codes = qa.codes.as<uint8_t>() + 8;  // unaligned codes cannot take it
  EXPECT_FALSE(gpu::raw::lin8_tc_gemm_supported(g));
}

// K of whole 32-blocks that is no multiple of the 128-byte stage: full stages, then a last stage of
// 1..3 blocks (the kernel breaks out of it after the last block and zero-fills the rest of the
// copies). 416 = 3 full stages + 1 block (no more steps than pipeline stages), 1312 = 10 + 1,
// 2144 = 16 + 3. Each on both tiles, at row counts of one, two and three token tiles of the
// larger tile, one part and a group of two with ragged outputs.
constexpr int64_t kPartialStageIns[] = {416, 1312, 2144};

TEST(GpuLin8TcGemm, PartialLastStageBitExactWhenBlockSumsFit) {
  for (int64_t in : kPartialStageIns) {
    ASSERT_NE((in / 32) % 4, 0) << in;  // a partial last stage
    for (int64_t m : {64, 129, 300}) {
      exact_case("partial stage", in, {200, 37}, m, m != 129);
      exact_case("partial stage", in, {96}, m, m == 129);
    }
  }
}

TEST(GpuLin8TcGemm, PartialLastStageWithinBound) {
  for (int64_t in : kPartialStageIns)
    for (int tile : tc_tiles(in)) {
      bound_case("partial stage", in, {200, 37}, 129, tile == 1, tile);
      bound_case("partial stage", in, {96}, 300, tile == 2, tile);
    }
}

TEST(GpuLin8TcGemm, PartialLastStageBatchTileAndGroupInvariant) {
  invariance_case("partial stage", 1312, {200, 37}, 130);
  invariance_case("partial stage", 2144, {96, 64}, 200);
}

// Sets the CUDA-core GEMM's row threshold and forced tile while in scope (the path of calls with
// exact_block_sums).
using SequentialGemmSettings =
    ScopedGemmDispatch<&gpu::raw::set_lin8_gemm_min_rows, &gpu::raw::set_lin8_gemm_tile>;

// (4) on the partial-stage K: calls with exact_block_sums, full-range codes, bit-identical to the
// CPU on every path they can take: the GEMV kernel, the automatic choice, and each CUDA-core GEMM
// tile forced (tiles 4 and 5 split K over 4 and 8 warp groups, which 13, 41 and 67 blocks leave
// uneven). The tensor-core settings are set to take every row count: they must not matter.
void sequential_case(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m, bool round_bf16) {
  const std::string what = describe(tag, in, outs, m) + (round_bf16 ? " bf16" : " f32") + " exact_block_sums";
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 23 + m * 11 + outs[0] * 7 + static_cast<int64_t>(outs.size())));
  const WeightGroup wg = make_weight_group(rng, in, outs, false);
  const std::vector<const Weight*>& parts = wg.parts;
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  const std::vector<int64_t> rows = checked_rows(m, in * wg.sum_out);
  std::vector<std::vector<float>> want;
  for (const Weight* w : parts) want.push_back(cpu_rows(*w, x, rows, round_bf16));
  TcSettings tc(1, 0);
  auto check = [&](const std::string& label) {
    const std::string wt = what + " " + label;
    const auto got = run(wt, parts, qa, 0, m, round_bf16, true);
    for (size_t p = 0; p < parts.size(); ++p)
      expect_equal(wt + " part " + std::to_string(p) + " vs cpu", pick_rows(got[p], outs[p], rows), want[p]);
  };
  {
    SequentialGemmSettings gemv(kNever, 0);
    EXPECT_FALSE(gpu::raw::lin8_gemm_takes(lin8_group_args(parts, qa, 0, m, round_bf16, true)));
    check("gemv");
  }
  {
    SequentialGemmSettings automatic(gpu::raw::kLin8GemmMinRows, 0);
    check("automatic");
  }
  for (int tile = 1; tile <= 5; ++tile) {
    if (!gpu::raw::lin8_gemm_tile_fits(tile)) continue;  // refused: TilesBeyondTheDeviceAreRefused
    SequentialGemmSettings forced(1, tile);
    EXPECT_TRUE(gpu::raw::lin8_gemm_takes(lin8_group_args(parts, qa, 0, m, round_bf16, true)));
    check("cuda-core gemm tile " + std::to_string(tile));
  }
}

// Under a device's shared-memory limit (GB10's 99 KB in the suites' second run): a forced tile of
// either GEMM that does not fit is refused with cudaErrorInvalidValue and writes nothing, a tile
// that fits runs; the engine's automatic choices keep to tiles that fit, so the real prefill shapes
// still take the tensor-core GEMM (and the unsplit CUDA-core tiles, which fit GB10 too, remain).
TEST(GpuLin8TcGemm, TilesBeyondTheDeviceAreRefused) {
  const ModelConfig& c = shape_sets()[0].cfg;
  const int64_t in = c.hidden_size, m = 130;
  const std::vector<int64_t> outs = {c.q_lora_rank, c.head_dim};
  Rng rng(77);
  const WeightGroup wg = make_weight_group(rng, in, outs, false);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  QuantAct qa(x, m, in);
  auto attempt = [&](const std::string& what, bool fits, auto&& call) {
    gpu::Lin8GroupArgs g = lin8_group_args(wg.parts, qa, 0, m, false, false);
    std::vector<std::unique_ptr<Guarded>> ys;
    for (size_t p = 0; p < wg.parts.size(); ++p) {
      ys.push_back(std::make_unique<Guarded>(static_cast<size_t>(m * outs[p]) * 4));
      ys[p]->poison();
      g.lin[p].y = ys[p]->as<float>();
      g.lin[p].y_stride = outs[p];
    }
    const cudaError_t e = call(g);
    sync_ok();
    if (fits) {
      EXPECT_EQ(e, cudaSuccess) << what;
      return;
    }
    EXPECT_EQ(e, cudaErrorInvalidValue) << what << ": a tile beyond the device's shared memory";
    for (size_t p = 0; p < wg.parts.size(); ++p) {
      EXPECT_TRUE(ys[p]->poisoned()) << what << " part " << p << ": a refused call wrote outputs";
      expect_guards(what, *ys[p]);
    }
  };
  for (int tile = 1; tile <= gpu::raw::kLin8TcTiles; ++tile)
    attempt("tensor-core tile " + std::to_string(tile), gpu::raw::lin8_tc_gemm_tile_fits(tile, in),
            [&](const gpu::Lin8GroupArgs& g) { return gpu::raw::lin8_tc_gemm(g, tile, nullptr); });
  for (int tile = 1; tile <= 5; ++tile) {
    SequentialGemmSettings forced(1, tile);
    attempt("cuda-core tile " + std::to_string(tile), gpu::raw::lin8_gemm_tile_fits(tile), [&](gpu::Lin8GroupArgs g) {
      for (int p = 0; p < g.count; ++p) g.lin[p].exact_block_sums = true;  // the CUDA-core GEMM's path
      return gpu::raw::lin8_gemm(g, nullptr);
    });
  }
  EXPECT_TRUE(gpu::raw::lin8_gemm_tile_fits(3)) << "the unsplit 128 x 128 CUDA-core tile (66 KB) fits every target";
  EXPECT_TRUE(gpu::raw::lin8_tc_gemm_supported(lin8_group_args(wg.parts, qa, 0, m, false, false)));
  for (const int64_t k : {c.hidden_size, c.q_lora_rank, c.o_groups * c.o_lora_rank, c.moe_intermediate_size})
    EXPECT_TRUE(gpu::raw::lin8_tc_gemm_tile_fits(2, k)) << "the 64 x 64 tensor-core tile must fit for K = " << k;
}

TEST(GpuLin8TcGemm, PartialLastStageExactBlockSumsMatchCpu) {
  for (int64_t in : kPartialStageIns)
    for (int64_t m : {64, 129}) {
      sequential_case("partial stage", in, {200, 37}, m, m == 64);
      sequential_case("partial stage", in, {96}, m, m != 64);
    }
}

}  // namespace
}  // namespace dsv41::test
