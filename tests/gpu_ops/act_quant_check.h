// The quantised output of a GPU op (e4m3 codes + fp32 scales of each 32-wide block) checked against
// the CPU engine's act_quant8 of the rows the op should have produced.
#pragma once
#include <string>
#include <vector>

#include "harness.h"
#include "model/ops/quant.h"

namespace dsv41::test {

// model::act_quant8 of every row of `x` [rows][k] against the device codes (e4m3 bytes) and scales.
inline void expect_act_quant(const std::string& what, const std::vector<float>& x, int64_t rows, int64_t k,
                             const Guarded& dcodes, const Guarded& dscales) {
  const int64_t nb = k / 32;
  std::vector<float> want_codes(static_cast<size_t>(rows * k)), want_scales(static_cast<size_t>(rows * nb));
  for (int64_t r = 0; r < rows; ++r) model::act_quant8(&x[r * k], k, &want_codes[r * k], &want_scales[r * nb]);
  const std::vector<uint8_t> bytes = dcodes.host<uint8_t>();
  std::vector<float> got_codes(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) got_codes[i] = e4m3_to_f32(bytes[i]);
  expect_equal(what + " codes", got_codes, want_codes);
  expect_equal(what + " scales", dscales.host<float>(), want_scales);
  expect_guards(what + " codes", dcodes);
  expect_guards(what + " scales", dscales);
}

}  // namespace dsv41::test
