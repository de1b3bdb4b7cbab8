// GPU parity of the decode-sized RMSNorm forms, bit for bit against the CPU reference engine:
//  - the fused mHC collapse + RMSNorm (+ ActQuant8 codes) of gpu::hc_collapse_rms_norm against
//    hc_collapse, rms_norm and act_quant8 applied one after the other, at 1 to 4 rows (one cluster
//    of blocks per row), at 32 rows (the cluster form's limit) and at 33 and 64 rows (the two
//    launches), with the weights of the attention site (pre, hc apart) and of the MoE site (mix
//    rows, (2+hc)*hc apart), streams on and off the 16-byte grid; and for every hc = 1..16 at 1, 2
//    and 4 rows, with the fallback's two launches called directly and taken by the op past 32 rows;
//  - rms_norm at few rows on both sides of the cluster form's lower width limit (rows of 2 and 3
//    independent 512-element steps of the reference sum keep one block; the hidden width, a width
//    with a partial last step, one with elements past the last step and a 40-step width take a
//    cluster), in place and strided, with codes, with the bf16 copy, and with the fused RoPE +
//    QDQ8 tail;
//  - the fused op's argument checks.
// Real and tiny shapes (the tiny rows are one step wide: the one-block form), guard bytes around
// every output.
#include <gtest/gtest.h>

#include <algorithm>

#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_collapse_norm.h"
#include "act_quant_check.h"
#include "harness.h"
#include "model/cpu_impl.h"
#include "model/ops/mhc.h"
#include "model/ops/quant.h"
#include "model/ops/rope.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// One collapse + RMSNorm case on the device: n rows of hc streams of the config's hidden width
// (one float off the 16-byte grid when `unaligned`), weights w_stride apart, the output normed in
// place (with ActQuant8 codes when `codes`); `want` is the CPU reference's hc_collapse then
// rms_norm. zero_norm_block zeroes the first 32 norm weights (a zero block: the codes' amax floor).
struct CollapseNormRun {
  std::vector<float> want;
  Guarded dh, dw, dnw, dx, dcodes, dscales;
  gpu::HcCollapseArgs ca;
  gpu::RmsNormArgs na;
};

CollapseNormRun make_collapse_norm_run(const ModelConfig& c, int64_t hc, int64_t n, int64_t w_stride, bool codes,
                                       bool unaligned, bool zero_norm_block, Rng& rng) {
  const int64_t dim = c.hidden_size, k = hc * dim;
  const std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n * k), 1.5f);
  std::vector<float> w(static_cast<size_t>(n * w_stride));
  for (float& v : w) v = rng.uniform(0.0f, 1.0f);  // sigmoid-range weights as the mix gives
  std::vector<float> nw = rng.bf16_vec(static_cast<size_t>(dim));
  if (zero_norm_block)
    for (int64_t i = 0; i < 32 && i < dim; ++i) nw[static_cast<size_t>(i)] = 0.0f;
  std::vector<float> want(static_cast<size_t>(n * dim)), xs(static_cast<size_t>(dim));
  for (int64_t t = 0; t < n; ++t) {
    model::hc_collapse(&h[t * k], &w[t * w_stride], hc, dim, xs.data());
    model::rms_norm(xs.data(), nw.data(), dim, c.rms_norm_eps, &want[t * dim]);
  }
  std::vector<float> hp(h.size() + 1, 0.0f);
  std::copy(h.begin(), h.end(), hp.begin() + 1);
  Guarded dh = Guarded::from(unaligned ? hp : h), dw = Guarded::from(w), dnw = Guarded::from(nw);
  Guarded dx(static_cast<size_t>(n * dim) * 4);
  Guarded dcodes(static_cast<size_t>(n * dim), 0x7F), dscales(static_cast<size_t>(n * dim / 32) * 4);
  const gpu::HcCollapseArgs ca{dh.as<float>() + (unaligned ? 1 : 0), dw.as<float>(), w_stride, n, hc, dim, dx.as<float>()};
  gpu::RmsNormArgs na{dx.as<float>(), dim, dnw.as<float>(), dx.as<float>(), dim, n, dim, static_cast<float>(c.rms_norm_eps)};
  if (codes) {
    na.codes = dcodes.as<uint8_t>();
    na.scales = dscales.as<float>();
  }
  return CollapseNormRun{std::move(want), std::move(dh),      std::move(dw), std::move(dnw), std::move(dx),
                         std::move(dcodes), std::move(dscales), ca,            na};
}

// The run's rows (and codes when asked) against the oracle, bit for bit, and its guard bytes.
void expect_collapse_norm(const std::string& what, const CollapseNormRun& r, int64_t n, int64_t dim, bool codes) {
  expect_equal(what, r.dx.host<float>(), r.want);
  expect_guards(what, r.dx);
  if (codes) expect_act_quant(what, r.want, n, dim, r.dcodes, r.dscales);
}

TEST(GpuCollapseNorm, FusedCollapseNormExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t hc = c.hc_mult, dim = c.hidden_size, n_mix = (2 + hc) * hc;
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{32}, int64_t{33}, int64_t{64}}) {
      for (int64_t w_stride : {hc, n_mix}) {
        for (bool codes : {true, false}) {
          const bool unaligned = n == 3;  // streams one float off the 16-byte grid
          const std::string what = s.name + " collapse+norm n=" + std::to_string(n) + " w_stride=" + std::to_string(w_stride) +
                                   (codes ? " codes" : "") + (unaligned ? " unaligned" : "");
          SCOPED_TRACE(what);
          Rng rng(static_cast<uint64_t>(n * 31 + w_stride * 3 + codes));
          const CollapseNormRun r = make_collapse_norm_run(c, hc, n, w_stride, codes, unaligned, true, rng);
          const gpu::HcCollapseArgs& ca = r.ca;
          const gpu::RmsNormArgs& na = r.na;
          gpu::hc_collapse_rms_norm(ca, na, nullptr);
          sync_ok();
          expect_collapse_norm(what, r, n, dim, codes);
          if (s.name == "real" && n <= 4 && codes && w_stride == hc) {
            report_time(what, time_us([&] { gpu::hc_collapse_rms_norm(ca, na, nullptr); }));
            report_time(what + " (two launches)", time_us([&] {
                          gpu::hc_collapse(ca, nullptr);
                          gpu::rms_norm(na, nullptr);
                        }));
          }
        }
      }
    }
  }
}

TEST(GpuCollapseNorm, RmsNormFewRowsBothFormsExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t D = c.hidden_size;
    // 1024: two steps, the q_lora rank (real: three): one block; D + 40: a partial last step and
    // 8 values past it; D + 1: one value past the last step; 4 D: 40 steps
    for (int64_t d : {D, c.q_lora_rank, int64_t{1024}, D + 40, D + 1, 4 * D}) {
      for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{32}}) {
        const bool in_place = rows != 2, quant = d % 32 == 0;
        const int64_t x_stride = in_place ? d : d + 4, out_stride = in_place ? d : d + 36;
        const std::string what = s.name + " rms_norm d=" + std::to_string(d) + " rows=" + std::to_string(rows) +
                                 (in_place ? " in place" : " strided") + (quant ? " codes+bf16" : "");
        SCOPED_TRACE(what);
        Rng rng(static_cast<uint64_t>(d * 13 + rows));
        const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(rows * x_stride), 2.0f);
        const std::vector<float> w = rng.bf16_vec(static_cast<size_t>(d));
        std::vector<float> want(static_cast<size_t>(rows * d));
        for (int64_t r = 0; r < rows; ++r) model::rms_norm(&x[r * x_stride], w.data(), d, c.rms_norm_eps, &want[r * d]);
        Guarded dx = Guarded::from(x), dw = Guarded::from(w), dout(static_cast<size_t>(rows * out_stride) * 4);
        Guarded dcodes(static_cast<size_t>(rows * d), 0x7F), dscales(static_cast<size_t>(rows * d / 32) * 4);
        Guarded dbits(static_cast<size_t>(rows * d) * 2);
        gpu::RmsNormArgs a{dx.as<float>(), x_stride, dw.as<float>(), in_place ? dx.as<float>() : dout.as<float>(),
                           out_stride, rows, d, static_cast<float>(c.rms_norm_eps)};
        if (quant) {
          a.codes = dcodes.as<uint8_t>();
          a.scales = dscales.as<float>();
          a.bf16_out = dbits.as<uint16_t>();
          a.bf16_stride = d;
        }
        gpu::rms_norm(a, nullptr);
        sync_ok();
        const std::vector<float> all = in_place ? dx.host<float>() : dout.host<float>();
        std::vector<float> got(static_cast<size_t>(rows * d));
        const int64_t st = in_place ? x_stride : out_stride;
        for (int64_t r = 0; r < rows; ++r) std::copy_n(&all[r * st], d, &got[r * d]);
        expect_equal(what, got, want);
        expect_guards(what, in_place ? dx : dout);
        if (quant) {
          expect_act_quant(what, want, rows, d, dcodes, dscales);
          expect_equal(what + " bf16 copy", dbits.host<uint16_t>(), to_bf16_bits(want));
          expect_guards(what + " bf16 copy", dbits);
        }
      }
    }
  }
}

// The RoPE + QDQ8 tail (the attention's kv rows' form) on wider rows, on both sides of the cluster
// form's lower width limit (the hidden width of the real shapes takes a cluster).
TEST(GpuCollapseNorm, RmsNormWideRowsRopeQdq8Exact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t rd = c.qk_rope_head_dim;
    const model::RopeTable table = model::RopeTable::for_ratio(c, 0);
    DeviceBuffer dfreq = DeviceBuffer::from(table.freqs());
    for (int64_t d : {int64_t{1024}, c.hidden_size}) {
      for (int64_t rows : {int64_t{1}, int64_t{3}}) {
        const std::string what = s.name + " rms_norm+rope+qdq8 d=" + std::to_string(d) + " rows=" + std::to_string(rows);
        SCOPED_TRACE(what);
        Rng rng(static_cast<uint64_t>(rows) + 77);
        const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(rows * d), 2.0f), w = rng.bf16_vec(static_cast<size_t>(d));
        const int64_t pos0 = 1234;
        std::vector<float> want(x.size());
        for (int64_t r = 0; r < rows; ++r) {
          float* row = &want[r * d];
          model::rms_norm(&x[r * d], w.data(), d, c.rms_norm_eps, row);
          table.apply(row + d - rd, pos0 + r, false);
          model::qdq8_inplace(row, d);
        }
        Guarded dx = Guarded::from(x), dw = Guarded::from(w);
        gpu::RmsNormArgs a{dx.as<float>(), d, dw.as<float>(), dx.as<float>(), d, rows, d, static_cast<float>(c.rms_norm_eps)};
        a.rope.freqs = dfreq.as<float>();
        a.rope.rope_dim = rd;
        a.rope.pos0 = pos0;
        a.qdq8 = true;
        gpu::rms_norm(a, nullptr);
        sync_ok();
        expect_equal(what, dx.host<float>(), want);
        expect_guards(what, dx);
      }
    }
  }
}

// How a collapse + RMSNorm case runs: the fused op (one cluster launch per row at decode sizes on a
// device with clusters, else its fallback), or the fallback's two launches called directly
// (hc_collapse, then rms_norm in place on its rows).
enum class CollapseNormForm { Fused, TwoLaunches };

// One case of n rows of hc streams of the config's hidden width, weights w_stride apart; the CPU
// reference's hc_collapse then rms_norm (then act_quant8 when `codes`) is the oracle, bit for bit.
void collapse_norm_case(const Shapes& s, int64_t hc, int64_t n, int64_t w_stride, bool codes, bool unaligned,
                        CollapseNormForm form) {
  const ModelConfig& c = s.cfg;
  const std::string what = s.name + (form == CollapseNormForm::Fused ? " fused" : " two launches") + " hc=" +
                           std::to_string(hc) + " n=" + std::to_string(n) + " w_stride=" + std::to_string(w_stride) +
                           (codes ? " codes" : "") + (unaligned ? " unaligned" : "");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(hc * 1009 + n * 31 + w_stride * 3 + codes + (unaligned ? 7 : 0)));
  const CollapseNormRun r = make_collapse_norm_run(c, hc, n, w_stride, codes, unaligned, false, rng);
  if (form == CollapseNormForm::Fused) {
    gpu::hc_collapse_rms_norm(r.ca, r.na, nullptr);
  } else {
    gpu::hc_collapse(r.ca, nullptr);
    gpu::rms_norm(r.na, nullptr);
  }
  sync_ok();
  expect_collapse_norm(what, r, n, c.hidden_size, codes);
}

// Every stream count the op takes (hc = 1..16; above 8 the cluster kernel collapses element by
// element instead of in 16-byte vectors), at the decode batches 1, 2 and 4 (the real width takes a
// cluster of blocks per row), with the weights of both sites (hc and (2+hc)*hc apart), streams on
// and off the 16-byte grid.
// The fallback: there is no switch that turns the cluster form off (it is chosen by the device's
// cudaDevAttrClusterLaunch, the row count and the row width: kernels/ops/norm.cu
// cluster_form_blocks), so its two launches are called directly at the same sizes, and the fused op
// is run at 33 and 40 rows, past the cluster form's 32, where it takes them itself (hc_collapse and
// the one-block-per-row RMSNorm a device without clusters runs at every row count; its rows are
// independent, so 33 rows exercise the code one row would). The tiny width (one 512-element step)
// takes the fallback at every row count.
TEST(GpuCollapseNorm, EveryHcClusterAndFallbackExact) {
  for (const Shapes& s : shape_sets()) {
    for (int64_t hc = 1; hc <= 16; ++hc) {
      for (int64_t w_stride : {hc, (2 + hc) * hc}) {
        for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{4}}) {
          const bool codes = n != 2, unaligned = n == 2 && w_stride == hc;
          collapse_norm_case(s, hc, n, w_stride, codes, unaligned, CollapseNormForm::Fused);
          collapse_norm_case(s, hc, n, w_stride, !codes, unaligned, CollapseNormForm::TwoLaunches);
        }
        collapse_norm_case(s, hc, 33, w_stride, true, false, CollapseNormForm::Fused);
        collapse_norm_case(s, hc, 40, w_stride, false, w_stride == hc, CollapseNormForm::Fused);
      }
    }
  }
}

TEST(GpuCollapseNorm, RejectsBadArguments) {
  const ModelConfig& c = shape_sets()[0].cfg;
  const int64_t hc = c.hc_mult, dim = c.hidden_size, n = 2;
  DeviceBuffer dh(static_cast<size_t>(n * hc * dim) * 4), dw(static_cast<size_t>(n * hc) * 4), dnw(static_cast<size_t>(dim) * 4);
  DeviceBuffer dx(static_cast<size_t>(n * dim) * 4), dy(static_cast<size_t>(n * dim) * 4);
  const gpu::HcCollapseArgs ca{dh.as<float>(), dw.as<float>(), hc, n, hc, dim, dx.as<float>()};
  const gpu::RmsNormArgs ok{dx.as<float>(), dim, dnw.as<float>(), dx.as<float>(), dim, n, dim, 1e-6f};
  gpu::RmsNormArgs r = ok;
  r.out = dy.as<float>();  // not in place
  EXPECT_THROW(gpu::hc_collapse_rms_norm(ca, r, nullptr), Error);
  r = ok;
  r.rows = n + 1;  // rows disagree
  EXPECT_THROW(gpu::hc_collapse_rms_norm(ca, r, nullptr), Error);
  r = ok;
  r.codes = dy.as<uint8_t>();  // codes without scales
  EXPECT_THROW(gpu::hc_collapse_rms_norm(ca, r, nullptr), Error);
  gpu::HcCollapseArgs cb = ca;
  cb.hc = 17;
  EXPECT_THROW(gpu::hc_collapse_rms_norm(cb, ok, nullptr), Error);
  gpu::hc_collapse_rms_norm(ca, ok, nullptr);  // the valid call runs
  sync_ok();
}

}  // namespace
}  // namespace dsv41::test
