// GPU f16 rows that carry their block scales (ops/scaled_rows.h, the B operand of the tensor-core
// GEMMs' scaled path) against a host computation of the same definition: per row the exponents of
// the blocks with a nonzero code, c = 7 - the largest, each value code · 2^(e_b + c) rounded once to
// f16 (exact for rows whose blocks lie within 2^12; with round_wide, the smaller blocks of wider rows
// rounded, down to subnormals and zeros), info = c; rows with a scale that is not a normal power of
// two, or too wide without round_wide, get kScaledRowUnscaled and keep their poisoned values.
#include <gtest/gtest.h>

#include <cmath>

#include "dsv41/common/numeric.h"
#include "harness.h"
#include "ops/scaled_rows.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

struct Expected {
  int32_t info = gpu::kScaledRowUnscaled;
  std::vector<uint16_t> values;  // empty: the row has no form
};

// The host definition, row by row.
Expected expected_row(const uint8_t* codes, const float* scales, int64_t k, bool round_wide) {
  const int64_t nb = k / 32;
  int e_max = -1000, e_min = 1000;
  bool bad = false;
  for (int64_t b = 0; b < nb; ++b) {
    bool nonzero = false;
    for (int i = 0; i < 32; ++i) nonzero |= (codes[b * 32 + i] & 0x7F) != 0;
    if (!nonzero) continue;
    int e = 0;
    const float m = std::frexp(scales[b], &e);  // scale = m · 2^e
    if (m != 0.5f || !std::isnormal(scales[b])) {
      bad = true;
      continue;
    }
    e_max = std::max(e_max, e - 1);
    e_min = std::min(e_min, e - 1);
  }
  Expected x;
  const bool any = e_max >= e_min;
  const int c = any ? 7 - e_max : 0;
  if (bad || c < 0 || c > 100 || (any && e_max - e_min > 12 && !round_wide)) return x;
  x.info = c;
  for (int64_t i = 0; i < k; ++i) {
    int e = 0;
    std::frexp(scales[i / 32], &e);
    x.values.push_back(f64_to_f16_bits(std::ldexp(static_cast<double>(e4m3_to_f32(codes[i])), e - 1 + c)));
  }
  return x;
}

TEST(GpuOps, ScaledRowsMatchTheirDefinition) {
  constexpr int64_t k = 256, nb = k / 32;
  Rng rng(29);
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  auto add_row = [&](std::vector<int> exps) {  // one exponent per block; 999: a block of ±0 codes
    for (int64_t b = 0; b < nb; ++b)
      for (int i = 0; i < 32; ++i) {
        uint8_t code = static_cast<uint8_t>(rng.g());
        if ((code & 0x7F) == 0x7F) code ^= 1;  // no NaN codes: their payload is not part of the definition
        codes.push_back(exps[b] == 999 ? static_cast<uint8_t>(code & 0x80) : code);
      }
    for (int64_t b = 0; b < nb; ++b) scales.push_back(std::ldexp(1.0f, exps[b] == 999 ? -120 : exps[b]));
  };
  add_row({-6, -7, -5, -8, -6, -9, -4, -6});        // within 2^12: exact either way
  add_row({0, -2, -2, -20, -2, -1, -3, -2});        // spans 2^20: rounded with round_wide
  add_row({3, -45, -2, -2, -60, -2, -110, -1});     // blocks far below: subnormals and zeros
  add_row({-3, 999, -4, -2, 999, -3, -5, -2});      // zero blocks with a scale far away do not count
  add_row({999, 999, 999, 999, 999, 999, 999, 999});  // all zeros: c = 0
  add_row({-3, -2, -4, -2, -3, -3, -5, -2});
  scales.back() = 3.0f;  // not a power of two: never a form
  add_row({12, 10, 11, 10, 12, 9, 8, 10});          // c = 7 - 12 < 0: no form
  const int64_t rows = static_cast<int64_t>(scales.size()) / nb;

  const DeviceBuffer dcodes = DeviceBuffer::from(codes), dscales = DeviceBuffer::from(scales);
  for (const bool round_wide : {false, true}) {
    const std::string what = std::string("scaled_rows, round_wide ") + (round_wide ? "on" : "off");
    Guarded out(static_cast<size_t>(rows * k) * 2), info(static_cast<size_t>(rows) * 4);
    gpu::ScaledRowsArgs a{dcodes.as<uint8_t>(), dscales.as<float>(), rows, k, out.as<uint16_t>(), info.as<int32_t>()};
    a.round_wide = round_wide;
    ASSERT_EQ(gpu::raw::scaled_rows(a, nullptr), cudaSuccess);
    sync_ok();
    const std::vector<uint16_t> got = out.host<uint16_t>();  // rows without a form keep Guarded's 0xFF bytes
    const std::vector<int32_t> got_info = info.host<int32_t>();
    int formed = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const Expected x = expected_row(&codes[r * k], &scales[r * nb], k, round_wide);
      EXPECT_EQ(got_info[r], x.info) << what << ", row " << r;
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t want = x.values.empty() ? uint16_t{0xFFFF} : x.values[i];
        if (got[r * k + i] != want && wrong++ == 0) first = i;
      }
      EXPECT_EQ(wrong, 0) << what << ", row " << r << ": " << wrong << " values differ, first at " << first;
      formed += x.values.empty() ? 0 : 1;
    }
    EXPECT_EQ(formed, round_wide ? 5 : 3) << what << ": rows with an f16 form";
    expect_guards(what + " out", out);
    expect_guards(what + " info", info);
  }
}

}  // namespace
}  // namespace dsv41::test
