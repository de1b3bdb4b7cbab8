// The CPU decoder against exllamav3's own outputs (tests/fixtures/exl3, EXL3.md §5.4) and against an
// independent bit-level packer for the K values and codebooks the fixture does not cover.
#include <gtest/gtest.h>

#include <random>

#include "dsv41/common/numeric.h"
#include "dsv41/exl3/decoder.h"
#include "exl3_test_util.h"

namespace dsv41::exl3 {
namespace {

using test::fixture_path;
using test::lookup_in;

TEST(Exl3Codebook, LutsEqualFixture) {
  auto f = SafetensorsFile::open(fixture_path());
  const Codebook cbs[3] = {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1};
  for (int i = 0; i < 3; ++i) {
    const TensorInfo* t = f->find("lut_cb" + std::to_string(i) + "_f16");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->numel(), 65536);
    const std::vector<uint16_t> ref = test::u16_of(*t);
    const uint16_t* lut = codebook_lut_f16(cbs[i]);
    int mismatches = 0;
    for (uint32_t s = 0; s < 65536; ++s) {
      if (lut[s] != ref[s]) ++mismatches;
      if (decode_state_f16(cbs[i], s) != ref[s]) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0) << "codebook " << codebook_name(cbs[i]);
  }
}

TEST(Exl3Codebook, Mul1Statistics) {
  // EXL3.md §2.5: MUL1 mean -0.0019, std 1.0003, range [-3.453, 3.348].
  const float* lut = codebook_lut_f32(Codebook::kMul1);
  double s = 0, s2 = 0, lo = 1e9, hi = -1e9;
  for (int i = 0; i < 65536; ++i) {
    s += lut[i];
    s2 += double(lut[i]) * lut[i];
    lo = std::min<double>(lo, lut[i]);
    hi = std::max<double>(hi, lut[i]);
  }
  const double mean = s / 65536, sd = std::sqrt(s2 / 65536 - mean * mean);
  EXPECT_NEAR(mean, -0.0019, 5e-4);
  EXPECT_NEAR(sd, 1.0003, 5e-4);
  EXPECT_NEAR(lo, -3.453, 1e-3);
  EXPECT_NEAR(hi, 3.348, 1e-3);
}

TEST(Exl3Decoder, WHatBitExactAgainstReconstruct) {
  auto f = SafetensorsFile::open(fixture_path());
  for (int K : {2, 3, 4}) {
    const std::string p = "k" + std::to_string(K);
    Exl3Tensors t = read_exl3_tensors(lookup_in(*f), p, fixture_path());
    ASSERT_EQ(t.K, K);
    ASSERT_EQ(t.codebook, Codebook::kMul1);
    ASSERT_EQ(t.k, 256);
    ASSERT_EQ(t.n, 384);
    std::vector<uint16_t> hat(static_cast<size_t>(t.k * t.n));
    reconstruct_f16(t.trellis, t.k, t.n, t.K, t.codebook, hat.data());
    const std::vector<uint16_t> ref = test::u16_of(*f->find(p + ".ref_w_hat_f16"));
    int64_t mismatches = 0;
    for (size_t i = 0; i < ref.size(); ++i) mismatches += hat[i] != ref[i];
    EXPECT_EQ(mismatches, 0) << p;
  }
}

TEST(Exl3Decoder, FullWeightMatchesFp64Reference) {
  auto f = SafetensorsFile::open(fixture_path());
  for (int K : {2, 3, 4}) {
    const std::string p = "k" + std::to_string(K);
    Exl3Tensors t = read_exl3_tensors(lookup_in(*f), p, fixture_path());
    const std::vector<float> full = full_weight_f32(t.view());
    const std::vector<float> ref = tensor_to_f32(*f->find(p + ".ref_w_full_f32"));
    EXPECT_LT(test::rms_rel(full, ref), 2e-3) << p;
    // Our W_full uses the exact decoded W_hat in fp32, so it should in fact be far closer.
    EXPECT_LT(test::rms_rel(full, ref), 1e-5) << p;
  }
}

TEST(Exl3Decoder, MatmulMatchesFp64Pairs) {
  auto f = SafetensorsFile::open(fixture_path());
  for (int K : {2, 3, 4}) {
    const std::string p = "k" + std::to_string(K);
    Exl3Tensors t = read_exl3_tensors(lookup_in(*f), p, fixture_path());
    const TensorInfo* xt = f->find(p + ".ref_x_f32");
    const std::vector<float> x = tensor_to_f32(*xt);
    const std::vector<float> ref = tensor_to_f32(*f->find(p + ".ref_y_f32"));
    const int64_t m = xt->shape[0];
    std::vector<float> y(static_cast<size_t>(m * t.n));
    exl3_matmul_f32(t.view(), x.data(), m, y.data());
    EXPECT_LT(test::rms_rel(y, ref), 1e-3) << p;
    EXPECT_LT(test::max_rel(y, ref), 1e-3) << p;
  }
}

TEST(Exl3Decoder, HadamardIsOrthonormalSylvester) {
  // H[i][j] = (-1)^popcount(i&j) / sqrt(128): transform unit vectors and compare columns.
  for (int j : {0, 1, 5, 64, 127}) {
    std::vector<float> v(128, 0.0f);
    v[j] = 1.0f;
    hadamard128(v.data(), 128);
    for (int i = 0; i < 128; ++i) {
      const float expect = (__builtin_popcount(i & j) % 2 ? -1.0f : 1.0f) / std::sqrt(128.0f);
      ASSERT_NEAR(v[i], expect, 1e-7) << i << "," << j;
    }
  }
}

// Independent packer (EXL3.md §2.2): symbols MSB first into 16-bit units, then the two units of
// every 32-bit pair swapped.
std::vector<uint16_t> pack_symbols(const std::vector<uint32_t>& sym, int K) {
  std::vector<int> bits;
  for (uint32_t s : sym)
    for (int b = K - 1; b >= 0; --b) bits.push_back((s >> b) & 1);
  std::vector<uint16_t> units(bits.size() / 16);
  for (size_t u = 0; u < units.size(); ++u) {
    uint16_t v = 0;
    for (int b = 0; b < 16; ++b) v = static_cast<uint16_t>((v << 1) | bits[u * 16 + b]);
    units[u] = v;
  }
  for (size_t u = 0; u + 1 < units.size(); u += 2) std::swap(units[u], units[u + 1]);
  return units;
}

TEST(Exl3Decoder, StatesFollowShiftRegisterForEveryK) {
  std::mt19937 rng(1234);
  for (int K = 1; K <= 8; ++K) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<uint32_t> sym(256);
      for (auto& s : sym) s = rng() & ((1u << K) - 1);
      const std::vector<uint16_t> tile = pack_symbols(sym, K);
      ASSERT_EQ(tile.size(), static_cast<size_t>(16 * K));
      uint16_t st[256];
      tile_states(tile.data(), K, st);
      // Tail-biting: the register entering symbol 0 holds the stream's last 16 bits.
      uint32_t reg = 0;
      for (int j = 0; j < 256; ++j) reg = ((reg << K) | sym[j]) & 0xFFFF;
      for (int j = 0; j < 256; ++j) {
        reg = ((reg << K) | sym[j]) & 0xFFFF;
        ASSERT_EQ(st[j], reg) << "K=" << K << " j=" << j;
      }
    }
  }
}

TEST(Exl3Decoder, TilePositionsCoverTileOnce) {
  std::vector<int> seen(256, 0);
  for (int j = 0; j < 256; ++j) {
    const TilePos p = tile_position(j);
    ASSERT_LT(p.row, 16);
    ASSERT_LT(p.col, 16);
    ++seen[p.row * 16 + p.col];
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  // Spot values from EXL3.md §2.4: lane 5, i = 6 -> rows {2,3,10,11}, col 1+8.
  EXPECT_EQ(tile_position(8 * 5 + 6).row, 10);
  EXPECT_EQ(tile_position(8 * 5 + 6).col, 9);
}

TEST(Exl3Decoder, AllCodebooksAndKsDecodeThroughLut) {
  // A random trellis for every K and codebook: reconstruct must place LUT[state(j)] at POS[j].
  std::mt19937 rng(99);
  for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
    for (int K = 1; K <= 8; ++K) {
      const int64_t k = 32, n = 48;
      std::vector<uint16_t> tr(static_cast<size_t>(k / 16 * n / 16 * 16 * K));
      for (auto& w : tr) w = static_cast<uint16_t>(rng());
      std::vector<uint16_t> hat(static_cast<size_t>(k * n));
      reconstruct_f16(tr.data(), k, n, K, cb, hat.data());
      for (int64_t tk = 0; tk < k / 16; ++tk)
        for (int64_t tn = 0; tn < n / 16; ++tn) {
          uint16_t st[256];
          tile_states(tr.data() + (tk * (n / 16) + tn) * 16 * K, K, st);
          for (int j = 0; j < 256; ++j) {
            const TilePos p = tile_position(j);
            ASSERT_EQ(hat[(tk * 16 + p.row) * n + tn * 16 + p.col], decode_state_f16(cb, st[j]));
          }
        }
    }
  }
}

}  // namespace
}  // namespace dsv41::exl3
