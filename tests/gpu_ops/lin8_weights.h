// Lin8 weights of the GPU linear tests: random codes and E8M0 scales written as a checkpoint, so the
// CPU reference reads them through its own loader, with device copies; the CPU's outputs of chosen
// rows; the rows a test compares.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "linear_inputs.h"
#include "model/linears.h"

namespace dsv41::test {

using ops::gpu::DeviceBuffer;

// Inputs whose every block sum fits in 24 bits: weight codes of exponents 2^-2 .. 2^1 (multiples of
// 2^-5 up to 3.75) or zero, activations of magnitude 1 .. 4 (ActQuant8 scales them to codes that
// are multiples of 8 below 256). Each product is a multiple of 2^-2 below 2^10, so every partial sum
// of a block, in any order, is exact in fp32: the tensor core's and the CPU's block sums agree.
inline std::vector<uint8_t> few_exponent_codes(Rng& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    const uint32_t r = static_cast<uint32_t>(rng.g());
    b = (r & 15) == 0 ? uint8_t{0} : static_cast<uint8_t>(((r >> 4) & 0x80) | ((5 + ((r >> 8) & 3)) << 3) | ((r >> 12) & 7));
  }
  return v;
}

// One Lin8 weight: host codes and scales, device copies, and the CPU reference's linear over them.
struct Lin8Weight {
  int64_t in, out;
  std::vector<uint8_t> codes, scales;
  DeviceBuffer dcodes, dscales;
  std::unique_ptr<TempCheckpoint> ck;
  std::unique_ptr<Linear> lin;
  Lin8Weight(int64_t in_, int64_t out_, std::vector<uint8_t> c, std::vector<uint8_t> s)
      : in(in_), out(out_), codes(std::move(c)), scales(std::move(s)) {
    SafetensorsWriter w;
    w.add("w.weight", DType::F8_E4M3, {out, in}, codes);
    w.add("w.scale", DType::F8_E8M0, {(out + 31) / 32, in / 32}, scales);
    ck = std::make_unique<TempCheckpoint>(w);
    lin = model::load_linear(*ck->ck, "w", in, out);
    dcodes = DeviceBuffer::from(codes);
    dscales = DeviceBuffer::from(scales);
  }
};

inline std::unique_ptr<Lin8Weight> make_weight(Rng& rng, int64_t in, int64_t out, bool few_exponents) {
  const size_t n = static_cast<size_t>(in * out);
  return std::make_unique<Lin8Weight>(in, out, few_exponents ? few_exponent_codes(rng, n) : rng.e4m3_bytes(n),
                                      rng.e8m0_bytes(static_cast<size_t>(((out + 31) / 32) * (in / 32))));
}

// The weights of one group call, one per output count in order, and the group's outputs per row.
struct WeightGroup {
  std::vector<std::unique_ptr<Lin8Weight>> owned;
  std::vector<const Lin8Weight*> parts;  // what group_args and run take
  int64_t sum_out = 0;
};
inline WeightGroup make_weight_group(Rng& rng, int64_t in, const std::vector<int64_t>& outs, bool few_exponents) {
  WeightGroup g;
  for (int64_t o : outs) {
    g.owned.push_back(make_weight(rng, in, o, few_exponents));
    g.parts.push_back(g.owned.back().get());
    g.sum_out += o;
  }
  return g;
}

// Rows compared with the CPU: all when the product is small, else a spread over the row tiles.
inline std::vector<int64_t> checked_rows(int64_t m, int64_t macs_per_row) {
  std::vector<int64_t> r;
  if (m * macs_per_row <= (int64_t{1} << 27)) {
    for (int64_t i = 0; i < m; ++i) r.push_back(i);
    return r;
  }
  for (int64_t i : {int64_t{0}, int64_t{7}, int64_t{63}, int64_t{64}, int64_t{130}, m / 2 + 3, m - 1})
    if (i < m && (r.empty() || r.back() < i)) r.push_back(i);
  return r;
}

// The CPU reference's outputs of `rows` of x.
inline std::vector<float> cpu_rows(const Lin8Weight& w, const std::vector<float>& x, const std::vector<int64_t>& rows,
                                   bool round_bf16) {
  std::vector<float> xs(rows.size() * w.in), y(rows.size() * w.out);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&x[rows[i] * w.in], w.in, &xs[i * w.in]);
  if (round_bf16) model::linear_bf16(*w.lin, xs.data(), static_cast<int64_t>(rows.size()), y.data());
  else w.lin->forward(xs.data(), static_cast<int64_t>(rows.size()), y.data());
  return y;
}
inline std::vector<float> pick_rows(const std::vector<float>& y, int64_t out, const std::vector<int64_t>& rows) {
  std::vector<float> v(rows.size() * out);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&y[rows[i] * out], out, &v[i * out]);
  return v;
}

// A group call's arguments over rows [r0, r0 + m) of the quantised input (outputs not set).
inline ops::gpu::Lin8GroupArgs lin8_group_args(const std::vector<const Lin8Weight*>& parts, const QuantAct& qa, int64_t r0,
                                               int64_t m, bool round_bf16, bool exact) {
  const int64_t in = parts[0]->in, nb = in / 32;
  ops::gpu::Lin8GroupArgs g;
  g.count = static_cast<int>(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    ops::gpu::Lin8Args& a = g.lin[p];
    a.w = {parts[p]->dcodes.as<uint8_t>(), parts[p]->dscales.as<uint8_t>(), in, parts[p]->out};
    a.x_codes = qa.codes.as<uint8_t>() + r0 * in;
    a.x_scales = qa.scales.as<float>() + r0 * nb;
    a.m = m;
    a.round_bf16 = round_bf16;
    a.exact_block_sums = exact;
  }
  return g;
}

// Runs the group call g (its outputs unset) as one lin8_group, or one lin8 per part when solo;
// returns each part's [m][out] outputs, written into guarded buffers whose rows are strided with
// gaps that must stay untouched (both checked).
inline std::vector<std::vector<float>> run_lin8_group(const std::string& what, ops::gpu::Lin8GroupArgs g,
                                                      const std::vector<const Lin8Weight*>& parts, int64_t m,
                                                      bool solo) {
  std::vector<std::unique_ptr<Guarded>> ys;
  for (size_t p = 0; p < parts.size(); ++p) {
    const int64_t stride = parts[p]->out + 1 + static_cast<int64_t>(p);
    ys.push_back(std::make_unique<Guarded>(static_cast<size_t>(m * stride) * 4));
    g.lin[p].y = ys[p]->as<float>();
    g.lin[p].y_stride = stride;
  }
  if (solo)
    for (int p = 0; p < g.count; ++p) ops::gpu::lin8(g.lin[p], nullptr);
  else ops::gpu::lin8_group(g, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  std::vector<std::vector<float>> out;
  for (size_t p = 0; p < parts.size(); ++p) {
    out.push_back(strided_rows(what, *ys[p], m, g.lin[p].y_stride, parts[p]->out));
    expect_guards(what, *ys[p]);
  }
  return out;
}

inline std::string describe(const std::string& tag, int64_t in, const std::vector<int64_t>& outs, int64_t m) {
  std::string s = tag + " in=" + std::to_string(in) + " outs=";
  for (int64_t o : outs) s += std::to_string(o) + ",";
  return s + " m=" + std::to_string(m);
}

}  // namespace dsv41::test
