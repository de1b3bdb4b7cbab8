// The decode-size tensor-core FP4 expert bank (kernels/ops/lin4_tc_gemv.cu), taken by row-invariant
// Lin4 calls without exact_block_sums. Its contract (ops/lin4_tc_gemv.h): (1) every output within a
// bound derived from the two block summations (two MMA steps against the CPU's sequential chain,
// the fold identical), and bit-identical to the CPU wherever no block sum rounds; (2) a pair's bits
// depend on nothing but its token and expert: not on the other pairs, their number, or whether the
// banks of a group run together; (3) empty slots (id -1, or an expert the bank does not hold) give
// zero rows, a NaN weight scale NaN in its row only; (4) with the kernel off or exact_block_sums
// the sequential sums, bit-identical to the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>

#include "dsv41/common/numeric.h"
#include "harness.h"
#include "linear_inputs.h"
#include "model/linears.h"
#include "ops/lin4_tc_gemv.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// The kernel on for each test of this file (whatever DSV41_LIN4_TC_GEMV says), restored after.
class GpuLin4TcGemv : public ::testing::Test {
 protected:
  void SetUp() override { prev_ = gpu::raw::set_lin4_tc_gemv(1); }
  void TearDown() override { gpu::raw::set_lin4_tc_gemv(prev_); }

 private:
  int prev_ = 0;
};

// A random FP4 bank [E][out][in] with E8M0 scales in [lo, hi], on the host, the device and (for the
// CPU reference) as a checkpoint of one Lin4 per expert.
struct Bank {
  int64_t in, out, n;
  std::vector<uint8_t> packed, scales;
  DeviceBuffer dpacked, dscales;
  std::unique_ptr<TempCheckpoint> ck;
  std::vector<std::unique_ptr<Linear>> lins;
  Bank(Rng& rng, int64_t n_, int64_t out_, int64_t in_, int lo = 112, int hi = 121) : in(in_), out(out_), n(n_) {
    packed.resize(static_cast<size_t>(n * out * in / 2));
    for (auto& b : packed) b = static_cast<uint8_t>(rng.g());
    scales = rng.e8m0_bytes(static_cast<size_t>(n * out * (in / 32)), lo, hi);
  }
  // Uploads (after any edit of the host bytes) and loads the CPU's experts.
  void finish() {
    dpacked = DeviceBuffer::from(packed);
    dscales = DeviceBuffer::from(scales);
    SafetensorsWriter w;
    for (int64_t e = 0; e < n; ++e) {
      const std::string p = "e" + std::to_string(e);
      w.add(p + ".weight", DType::I8, {out, in / 2}, packed.data() + e * out * in / 2, static_cast<size_t>(out * in / 2));
      w.add(p + ".scale", DType::F8_E8M0, {out, in / 32}, scales.data() + e * out * (in / 32),
            static_cast<size_t>(out * (in / 32)));
    }
    ck = std::make_unique<TempCheckpoint>(w);
    lins.clear();
    for (int64_t e = 0; e < n; ++e) lins.push_back(model::load_linear(*ck->ck, "e" + std::to_string(e), in, out));
  }
  gpu::Fp4Weight weight() const { return {dpacked.as<uint8_t>(), dscales.as<uint8_t>(), in, out, n}; }
};

struct Pairs {
  int64_t tokens, top_k, rows;
  bool gate_up;  // rows read token row / top_k; else row r reads input row r
  std::vector<int32_t> ids;
};

Pairs make_pairs(Rng& rng, int64_t tokens, int64_t top_k, int64_t n_experts, bool gate_up) {
  Pairs p{tokens, top_k, tokens * top_k, gate_up, {}};
  p.ids.resize(static_cast<size_t>(p.rows));
  for (auto& id : p.ids) id = static_cast<int32_t>(rng.below(n_experts));
  return p;
}

// Runs the banks as one group (or each alone) over pairs [r0, r0 + rows) into guarded outputs; each
// bank's [rows][out].
std::vector<std::vector<float>> run(const std::vector<const Bank*>& banks, const Pairs& pr, const QuantAct& qa,
                                    int64_t r0, int64_t rows, bool round_bf16, bool solo = false, bool row_invariant = true,
                                    bool exact = false) {
  DeviceBuffer dids = DeviceBuffer::from(pr.ids);
  std::vector<std::unique_ptr<Guarded>> ys;
  gpu::Lin4GroupArgs g;
  g.count = static_cast<int>(banks.size());
  const int64_t div = pr.gate_up ? pr.top_k : 1, in = banks[0]->in;
  for (size_t p = 0; p < banks.size(); ++p) {
    ys.push_back(std::make_unique<Guarded>(static_cast<size_t>(rows * (banks[p]->out + 3)) * 4));
    gpu::Lin4Args& a = g.lin[p];
    a.w = banks[p]->weight();
    // rows [r0, ..): the activation rows and expert ids from there (r0 a multiple of div)
    a.x_codes = qa.codes.as<uint8_t>() + (r0 / div) * in;
    a.x_scales = qa.scales.as<float>() + (r0 / div) * (in / 32);
    a.rows = rows;
    a.expert_ids = dids.as<int32_t>() + r0;
    a.x_row_div = div;
    a.y = ys.back()->as<float>();
    a.y_stride = banks[p]->out + 3;
    a.round_bf16 = round_bf16;
    a.row_invariant = row_invariant;
    a.exact_block_sums = exact;
  }
  if (row_invariant && !exact) EXPECT_TRUE(gpu::raw::lin4_tc_gemv_takes(g));
  if (solo) {
    for (int p = 0; p < g.count; ++p) gpu::lin4(g.lin[p], nullptr);
  } else {
    gpu::lin4_group(g, nullptr);
  }
  sync_ok();
  std::vector<std::vector<float>> out;
  for (size_t p = 0; p < banks.size(); ++p) {
    const std::vector<float> all = ys[p]->host<float>();
    const int64_t o = banks[p]->out, st = o + 3;
    std::vector<float> y(static_cast<size_t>(rows * o));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < o; ++i) y[r * o + i] = all[r * st + i];
      for (int64_t i = o; i < st; ++i) EXPECT_TRUE(std::isnan(all[r * st + i])) << "stride gap written";
    }
    EXPECT_TRUE(ys[p]->guards_ok()) << "write outside the outputs";
    out.push_back(std::move(y));
  }
  return out;
}

// The CPU's rows (zeros for empty slots).
std::vector<float> cpu_rows(const Bank& b, const Pairs& pr, const std::vector<float>& x, bool round_bf16) {
  std::vector<float> y(static_cast<size_t>(pr.rows * b.out), 0.0f);
  for (int64_t r = 0; r < pr.rows; ++r) {
    const int32_t e = pr.ids[r];
    if (e < 0 || e >= b.n) continue;
    const float* xr = &x[(pr.gate_up ? r / pr.top_k : r) * b.in];
    if (round_bf16) {
      model::linear_bf16(*b.lins[e], xr, 1, &y[r * b.out]);
    } else {
      b.lins[e]->forward(xr, 1, &y[r * b.out]);
    }
  }
  return y;
}

// (1) Each output against the CPU. With A = sum over the blocks of x_scale · w_scale · sum |code
// products|: the CPU's block chains round at most 32 times, 2^-24 of the block's magnitude each
// (2^-19 · A), the kernel's two MMA steps truncate at most 2^-22 · A each, and the fold's adds,
// the same in both but fed differently rounded terms, 2 nb · 2^-24 · A; bf16 outputs one bf16 unit
// (2^-7 relative) more. Returns the number of outputs bit-identical to the CPU.
size_t expect_within_bound(const std::string& what, const Bank& b, const Pairs& pr, const std::vector<float>& x,
                           const QuantAct& qa, const std::vector<float>& got, bool round_bf16) {
  const int64_t in = b.in, nb = in / 32, x_rows = pr.gate_up ? pr.tokens : pr.rows;
  const std::vector<uint8_t> xc = qa.codes.to_host<uint8_t>(static_cast<size_t>(x_rows * in));
  const std::vector<float> xsc = qa.scales.to_host<float>(static_cast<size_t>(x_rows * nb));
  const std::vector<float> want = cpu_rows(b, pr, x, round_bf16);
  size_t bad = 0, equal = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < pr.rows; ++r) {
    const int32_t e = pr.ids[r];
    const int64_t xr = pr.gate_up ? r / pr.top_k : r;
    for (int64_t o = 0; o < b.out; ++o) {
      const float g = got[r * b.out + o], cpu = want[r * b.out + o];
      double bound = 0.0;
      if (e >= 0 && e < b.n) {
        const uint8_t* wrow = &b.packed[(e * b.out + o) * (in / 2)];
        double a = 0.0;
        for (int64_t kb = 0; kb < nb; ++kb) {
          double s = 0.0;
          for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) {
            const uint8_t nib = (k % 2 == 0) ? (wrow[k / 2] & 0xF) : (wrow[k / 2] >> 4);
            s += std::fabs(double(e2m1_to_f32(nib))) * std::fabs(double(e4m3_to_f32(xc[xr * in + k])));
          }
          a += s * xsc[xr * nb + kb] * e8m0_to_f32(b.scales[(e * b.out + o) * nb + kb]);
        }
        // (+ one subnormal unit a term: a block's scaled part may round below fp32's normal range)
        bound = a * (std::ldexp(1.0, -19) + 2.0 * std::ldexp(1.0, -22) + 2.0 * double(nb) * std::ldexp(1.0, -24)) +
                double(nb) * std::ldexp(1.0, -149);
      }
      if (round_bf16) bound += std::ldexp(1.0, -7) * std::max(std::fabs(double(g)), std::fabs(double(cpu)));
      const double err = std::fabs(double(g) - cpu);
      const bool same = g == cpu || (std::isnan(g) && std::isnan(cpu));
      if (!same && !(err <= bound)) ++bad;
      equal += same;
      if (bound > 0 && !same) worst = std::max(worst, err / bound);
    }
  }
  std::printf("  [bound]  %-58s %zu/%lld equal to the cpu, worst error %.3f of the bound\n", what.c_str(), equal,
              static_cast<long long>(pr.rows * b.out), worst);
  EXPECT_EQ(bad, 0u) << what << ": outputs outside the bound";
  return equal;
}

std::string describe(const std::string& tag, const std::vector<const Bank*>& banks, int64_t rows) {
  std::string s = tag + " in=" + std::to_string(banks[0]->in) + " outs=";
  for (size_t p = 0; p < banks.size(); ++p) s += (p ? "," : "") + std::to_string(banks[p]->out);
  return s + " pairs=" + std::to_string(rows);
}

// (1) and (4) on one set of banks and pairs, and (2) by slices of one pair.
void check_case(const std::string& tag, Rng& rng, const std::vector<const Bank*>& banks, Pairs pr, bool round_bf16) {
  const std::string what = describe(tag, banks, pr.rows) + (round_bf16 ? " bf16" : " f32");
  SCOPED_TRACE(what);
  const int64_t in = banks[0]->in, x_rows = pr.gate_up ? pr.tokens : pr.rows;
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(x_rows * in));
  QuantAct qa(x, x_rows, in);
  const auto got = run(banks, pr, qa, 0, pr.rows, round_bf16);
  for (size_t p = 0; p < banks.size(); ++p) expect_within_bound(what, *banks[p], pr, x, qa, got[p], round_bf16);
  // (2) each bank alone, and every pair alone (its token's slots from there), give the same bits
  const auto solo = run(banks, pr, qa, 0, pr.rows, round_bf16, true);
  for (size_t p = 0; p < banks.size(); ++p) EXPECT_EQ(0, std::memcmp(solo[p].data(), got[p].data(), got[p].size() * 4)) << "solo bank " << p;
  const int64_t step = pr.gate_up ? pr.top_k : 1;
  for (int64_t r0 = 0; r0 < pr.rows; r0 += step * 3) {
    const int64_t rows = std::min<int64_t>(step, pr.rows - r0);
    const auto one = run(banks, pr, qa, r0, rows, round_bf16);
    for (size_t p = 0; p < banks.size(); ++p)
      EXPECT_EQ(0, std::memcmp(one[p].data(), &got[p][r0 * banks[p]->out], one[p].size() * 4))
          << "pairs from " << r0 << ", bank " << p << ": bits depend on the other pairs";
  }
  // (4) the sequential sums (kernel off by flag, or exact_block_sums): the CPU bit for bit (that the
  // kernel itself ran is BlockSumWhereTheChainRounds' check: random codes rarely make a sum round)
  const auto seq = run(banks, pr, qa, 0, pr.rows, round_bf16, false, false);
  const auto exact = run(banks, pr, qa, 0, pr.rows, round_bf16, false, true, true);
  for (size_t p = 0; p < banks.size(); ++p) {
    const std::vector<float> want = cpu_rows(*banks[p], pr, x, round_bf16);
    expect_equal(what + " sequential", seq[p], want);
    expect_equal(what + " exact_block_sums", exact[p], want);
  }
}

TEST_F(GpuLin4TcGemv, RealShapesWithinBound) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    if (c.hidden_size % 128 != 0 || c.moe_intermediate_size % 128 != 0) continue;
    const int64_t E = 8, K = std::min<int64_t>(c.num_experts_per_tok, E);
    Rng rng(static_cast<uint64_t>(c.hidden_size * 3 + c.moe_intermediate_size));
    Bank w1(rng, E, c.moe_intermediate_size, c.hidden_size), w3(rng, E, c.moe_intermediate_size, c.hidden_size);
    Bank w2(rng, E, c.hidden_size, c.moe_intermediate_size, 114, 121);
    w1.finish();
    w3.finish();
    w2.finish();
    for (int64_t tokens : {1, 4}) {
      check_case(s.name + " gate/up", rng, {&w1, &w3}, make_pairs(rng, tokens, K, E, true), true);
      check_case(s.name + " down", rng, {&w2}, make_pairs(rng, tokens, K, E, false), tokens == 1);
    }
    check_case(s.name + " gate f32", rng, {&w1}, make_pairs(rng, 2, K, E, true), false);
  }
}

TEST_F(GpuLin4TcGemv, RaggedShapesAndGroups) {
  Rng rng(77);
  Bank a(rng, 3, 37, 384), b(rng, 3, 300, 384), c(rng, 3, 5, 384), d(rng, 2, 16, 128, 100, 140);
  a.finish();
  b.finish();
  c.finish();
  d.finish();
  check_case("ragged", rng, {&a, &b, &c}, make_pairs(rng, 5, 2, 3, true), false);
  check_case("ragged", rng, {&a, &b, &c}, make_pairs(rng, 3, 3, 3, false), true);
  check_case("one segment, wide scales", rng, {&d}, make_pairs(rng, 7, 1, 2, false), false);
}

// (1) where the CPU's chain rounds: block 0 of output 0 holds seven products 6 · 448 = 2688 and then
// two of 0.5 · 3·2^-9, each 1.5 units of the last place at 18816; the chain rounds twice, half to
// even (18816 + 4 units), while the exact sum, 18816 + 3 units, is an fp32 value, which the two MMA
// steps (each partial sum exact here) return. So the kernel's output 0 is the exact sum and the
// CPU's one unit above it.
TEST_F(GpuLin4TcGemv, BlockSumWhereTheChainRounds) {
  Rng rng(5);
  Bank w(rng, 1, 16, 128);
  for (int64_t k = 0; k < 64; ++k) w.packed[k] = 0;  // output 0: codes 0 ...
  for (int64_t k = 0; k < 7; ++k) w.packed[k / 2] |= static_cast<uint8_t>(7 << (4 * (k % 2)));  // ... 6.0 at K 0..6
  w.packed[3] |= static_cast<uint8_t>(1 << 4);  // 0.5 at K 7
  w.packed[4] |= 1;                              // 0.5 at K 8
  w.scales[0] = 127;                             // block 0 of output 0: 1.0
  w.finish();
  std::vector<float> x = rng.bf16_vec(128);
  for (int64_t k = 0; k < 32; ++k) x[k] = k < 7 ? 448.0f : (k < 9 ? std::ldexp(3.0f, -9) : 0.0f);
  QuantAct qa(x, 1, 128);
  const std::vector<float> xs = qa.scales.to_host<float>(4);
  ASSERT_EQ(xs[0], 1.0f) << "block 0's activation codes are not the values themselves";
  Pairs pr = make_pairs(rng, 1, 1, 1, false);
  const auto got = run({&w}, pr, qa, 0, 1, false);
  const auto seq = run({&w}, pr, qa, 0, 1, false, false, false);
  const std::vector<float> want = cpu_rows(w, pr, x, false);
  const float exact = static_cast<float>(7.0 * 2688.0 + 2.0 * 0.5 * std::ldexp(3.0, -9));
  ASSERT_EQ(double(exact), 7.0 * 2688.0 + 2.0 * 0.5 * std::ldexp(3.0, -9));
  EXPECT_EQ(want[0], std::nextafter(exact, 1e9f)) << "the CPU's chain";
  EXPECT_EQ(seq[0][0], want[0]) << "the sequential kernel";
  EXPECT_EQ(got[0][0], exact) << "the tensor-core block sum";
  expect_within_bound("chain rounds", w, pr, x, qa, got[0], false);
}

// (3) Empty slots give zero rows; a NaN weight scale (byte 255) and scale byte 0 (2^-127) stay in
// their rows, as on the CPU.
TEST_F(GpuLin4TcGemv, EmptySlotsAndSpecialScales) {
  Rng rng(91);
  Bank w(rng, 4, 48, 512);
  const int64_t nb = w.in / 32;
  w.scales[(1 * w.out + 7) * nb + 3] = 255;  // expert 1, row 7, block 3: NaN
  for (int64_t kb = 0; kb < nb; kb += 2) w.scales[(2 * w.out + 20) * nb + kb] = 0;  // expert 2, row 20
  w.finish();
  Pairs pr = make_pairs(rng, 6, 1, 4, false);
  pr.ids = {1, -1, 2, 4, 1, 0};  // -1 and 4 (no such expert): zero rows
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(pr.rows * w.in));
  QuantAct qa(x, pr.rows, w.in);
  for (bool bf16 : {false, true}) {
    const auto got = run({&w}, pr, qa, 0, pr.rows, bf16);
    expect_within_bound("special scales", w, pr, x, qa, got[0], bf16);
    for (int64_t r = 0; r < pr.rows; ++r)
      for (int64_t o = 0; o < w.out; ++o) {
        const float v = got[0][r * w.out + o];
        const bool empty = pr.ids[r] < 0 || pr.ids[r] >= 4;
        if (empty) {
          EXPECT_EQ(0u, std::bit_cast<uint32_t>(v)) << "empty slot row " << r;
        } else {
          EXPECT_EQ(std::isnan(v), pr.ids[r] == 1 && o == 7) << "row " << r << " output " << o;
        }
      }
  }
}

}  // namespace
}  // namespace dsv41::test
