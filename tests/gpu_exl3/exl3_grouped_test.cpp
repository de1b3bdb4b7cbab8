// GPU parity of the grouped EXL3 linears (kernels/exl3/exl3_grouped.h, the MoE of large passes)
// against the CPU decoder: two sets of matrices with mixed bit widths, codebooks and biases, rows
// sorted by matrix in counts that cover 0, 1, every row class of a tile, several tiles, gathered
// source rows (repeats included), zero-extended inputs, trimmed outputs and scattered
// output rows; every row against exl3_matmul_f32 on its own matrix, the rows nobody owns untouched,
// bf16 rounding where asked, and the bits independent of how the tiles are split into launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <string>

#include "dsv41/common/error.h"
#include "gpu_util.h"

namespace dsv41::test {
namespace {

using ops::ActType;
using ops::GroupedTile;

struct GroupedCase {
  int64_t k, n, x_cols, y_cols;
  std::vector<std::array<int, 2>> classes[2];  // (bits, codebook) of each matrix, per set
  std::vector<int64_t> rows;                   // sorted rows per matrix (shared by both sets)
  ActType xt;
  bool round;
};

// Tiles of every (set, matrix) in 64-row pieces, grouped by (bits, codebook, row class).
std::map<std::array<int, 3>, std::vector<GroupedTile>> make_tiles(const GroupedCase& c, int sets) {
  std::map<std::array<int, 3>, std::vector<GroupedTile>> by_class;
  int64_t r0 = 0;
  for (size_t e = 0; e < c.rows.size(); ++e) {
    for (int64_t r = 0; r < c.rows[e]; r += 64)
      for (int s = 0; s < sets; ++s) {
        const auto rows = static_cast<int32_t>(std::min<int64_t>(64, c.rows[e] - r));
        const auto [bits, cb] = c.classes[s][e];
        by_class[{bits, cb, ops::grouped_row_class(rows)}].push_back(
            {s, static_cast<int32_t>(e), static_cast<int32_t>(r0 + r), rows});
      }
    r0 += c.rows[e];
  }
  return by_class;
}

void run_grouped(const GroupedCase& c, uint64_t seed) {
  const int sets = c.classes[1].empty() ? 1 : 2;
  const size_t nm = c.rows.size();
  std::vector<std::unique_ptr<RandomMatrix>> mats[2];
  std::vector<ops::Exl3Matrix> dev_mats[2];
  for (int s = 0; s < sets; ++s)
    for (size_t e = 0; e < nm; ++e) {
      const auto [bits, cb] = c.classes[s][e];
      mats[s].push_back(std::make_unique<RandomMatrix>(c.k, c.n, bits, cb, seed + 100 * s + e, (e + s) % 2 == 0));
      dev_mats[s].push_back(mats[s].back()->device());
    }
  const int64_t total = std::accumulate(c.rows.begin(), c.rows.end(), int64_t{0});
  const int64_t src_rows = 23, out_rows = total + 9, y_stride = c.y_cols + 3;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(src_rows * c.x_cols));
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> xraw;
  x = round_acts(x, c.xt, xraw);
  std::vector<int32_t> src(static_cast<size_t>(total)), matrix_of, out(static_cast<size_t>(out_rows));
  for (int32_t& s : src) s = static_cast<int32_t>(rng() % src_rows);
  for (size_t e = 0; e < nm; ++e)
    matrix_of.insert(matrix_of.end(), static_cast<size_t>(c.rows[e]), static_cast<int32_t>(e));
  std::iota(out.begin(), out.end(), 0);
  std::shuffle(out.begin(), out.end(), rng);
  out.resize(static_cast<size_t>(total));  // each sorted row to a distinct output row; 9 rows nobody writes

  DeviceBuffer d_x = DeviceBuffer::from(xraw), d_src = DeviceBuffer::from(src), d_mof = DeviceBuffer::from(matrix_of);
  DeviceBuffer d_out = DeviceBuffer::from(out);
  DeviceBuffer d_mats[2], d_xh[2], d_y[2];
  ops::GroupedInputParams in;
  in.x = d_x.get();
  in.x_type = c.xt;
  in.x_stride = in.x_cols = c.x_cols;
  in.src_row = d_src.as<int32_t>();
  in.matrix_of = d_mof.as<int32_t>();
  in.sets = sets;
  in.k = static_cast<int>(c.k);
  in.rows = total;
  ops::GroupedGemmParams g;
  g.k = static_cast<int>(c.k);
  g.n = static_cast<int>(c.n);
  g.y_stride = y_stride;
  g.y_cols = c.y_cols;
  g.out_row = d_out.as<int32_t>();
  g.round_bf16 = c.round;
  for (int s = 0; s < sets; ++s) {
    d_mats[s] = DeviceBuffer::from(dev_mats[s]);
    d_xh[s] = DeviceBuffer(static_cast<size_t>(std::max<int64_t>(total, 1) * c.k * 2));
    d_y[s] = DeviceBuffer(static_cast<size_t>(out_rows * y_stride * 4));
    in.mats[s] = g.mats[s] = d_mats[s].as<ops::Exl3Matrix>();
    in.xh[s] = d_xh[s].as<__half>();
    g.xh[s] = d_xh[s].as<__half>();
    g.y[s] = d_y[s].as<float>();
  }
  const auto by_class = make_tiles(c, sets);
  std::vector<GroupedTile> all;
  for (const auto& [cls, t] : by_class) all.insert(all.end(), t.begin(), t.end());
  DeviceBuffer d_tiles = DeviceBuffer::from(all.empty() ? std::vector<GroupedTile>(1) : all);

  // mode 0: one launch per class; mode 1: one launch per tile (the bits must not change).
  auto run = [&](int mode) {
    std::vector<std::vector<uint8_t>> got(static_cast<size_t>(sets));
    for (int s = 0; s < sets; ++s) EXPECT_EQ(cudaMemset(d_y[s].get(), 0xFF, d_y[s].bytes()), cudaSuccess);
    ops::exl3_grouped_input(in, nullptr);
    size_t first = 0;
    for (const auto& [cls, t] : by_class) {
      ops::GroupedGemmParams p = g;
      p.bits = cls[0];
      p.codebook = cls[1];
      p.row_class = cls[2];
      const size_t step = mode == 0 ? t.size() : 1;
      for (size_t i = 0; i < t.size(); i += step) {
        p.tiles = d_tiles.as<GroupedTile>() + first + i;
        p.ntiles = static_cast<int>(std::min(step, t.size() - i));
        ops::exl3_grouped_gemm(p, nullptr);
      }
      first += t.size();
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int s = 0; s < sets; ++s) got[static_cast<size_t>(s)] = d_y[s].to_host<uint8_t>(d_y[s].bytes());
    return got;
  };
  const auto a = run(0), b = run(0), per_tile = run(1);
  EXPECT_EQ(a, b) << "two identical runs differ";
  EXPECT_EQ(a, per_tile) << "the launch split changed the results";

  std::vector<bool> owned(static_cast<size_t>(out_rows), false);
  for (int32_t o : out) owned[static_cast<size_t>(o)] = true;
  for (int s = 0; s < sets; ++s) {
    SCOPED_TRACE("set " + std::to_string(s));
    const auto* y = reinterpret_cast<const float*>(a[static_cast<size_t>(s)].data());
    const auto* raw = reinterpret_cast<const uint32_t*>(y);
    for (int64_t o = 0; o < out_rows; ++o)
      for (int64_t i = 0; i < y_stride; ++i)
        if (!owned[static_cast<size_t>(o)] || i >= c.y_cols)
          ASSERT_EQ(raw[o * y_stride + i], 0xFFFFFFFFu) << "wrote row " << o << " column " << i;
    int64_t r = 0;
    for (size_t e = 0; e < nm; ++e) {
      SCOPED_TRACE("matrix " + std::to_string(e) + " (" + std::to_string(c.rows[e]) + " rows)");
      std::vector<float> got, want, xpad(static_cast<size_t>(c.k)), yref(static_cast<size_t>(c.n));
      for (int64_t i = 0; i < c.rows[e]; ++i, ++r) {
        std::fill(xpad.begin(), xpad.end(), 0.0f);
        std::copy_n(&x[static_cast<size_t>(src[static_cast<size_t>(r)] * c.x_cols)], c.x_cols, xpad.begin());
        exl3::exl3_matmul_f32(mats[s][e]->view(), xpad.data(), 1, yref.data());
        for (int64_t j = 0; j < c.y_cols; ++j) {
          const float v = y[out[static_cast<size_t>(r)] * y_stride + j];
          if (c.round) ASSERT_EQ(v, bf16_bits_to_f32(f32_to_bf16_bits(v))) << "not a bf16 value";
          got.push_back(v);
          want.push_back(yref[static_cast<size_t>(j)]);
        }
      }
      if (c.rows[e] == 0) continue;
      const double err = rel_rms(got, want);
      EXPECT_LE(err, c.round ? 5e-3 : 1e-3) << "relative RMS error " << err;
    }
  }
}

TEST(Exl3GpuGrouped, MatchesCpuReferencePerMatrix) {
  // Both sets of the MoE's gate/up form: classes shared and not shared between the sets.
  run_grouped({384, 256, 380, 250,
               {{{2, 2}, {3, 2}, {3, 2}, {4, 0}, {2, 2}}, {{3, 2}, {3, 1}, {3, 2}, {5, 2}, {3, 2}}},
               {1, 0, 65, 40, 130},
               ActType::F32,
               true},
              11);
  // One set (the down projection's form), every K and codebook once, no rounding, bf16 inputs.
  GroupedCase one{256, 384, 256, 384, {{}, {}}, {}, ActType::BF16, false};
  for (int K = 1; K <= 8; ++K) {
    one.classes[0].push_back({K, K % 3});
    one.rows.push_back(K == 4 ? 64 : K == 7 ? 33 : 3 * K + 1);
  }
  run_grouped(one, 23);
}

TEST(Exl3GpuGrouped, RefusesBadArguments) {
  ops::GroupedGemmParams g;
  g.bits = 3;
  g.codebook = 2;
  g.k = 256;
  g.n = 256;
  g.y_stride = g.y_cols = 256;
  g.ntiles = 1;
  EXPECT_THROW(ops::exl3_grouped_gemm(g, nullptr), Error);  // no tiles / matrices
  g.bits = 9;
  EXPECT_THROW(ops::exl3_grouped_gemm(g, nullptr), Error);
  g.bits = 3;
  g.n = 200;
  EXPECT_THROW(ops::exl3_grouped_gemm(g, nullptr), Error);
  g.n = 256;
  g.ntiles = 70000;
  EXPECT_THROW(ops::exl3_grouped_gemm(g, nullptr), Error);
  g.ntiles = 1;
  g.row_class = 5;
  EXPECT_THROW(ops::exl3_grouped_gemm(g, nullptr), Error);
  ops::GroupedInputParams in;
  in.k = 256;
  in.rows = 4;
  in.sets = 3;
  EXPECT_THROW(ops::exl3_grouped_input(in, nullptr), Error);
  in.sets = 1;
  EXPECT_THROW(ops::exl3_grouped_input(in, nullptr), Error);  // no x / matrices
}

}  // namespace
}  // namespace dsv41::test
