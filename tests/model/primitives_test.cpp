// Unit tests of the CPU reference primitives (MODEL.md §3.5, §4) against hand-derived values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/config/model_config.h"
#include "model/engram_hash.h"
#include "model/ops/mhc.h"
#include "model/ops/quant.h"
#include "model/ops/rope.h"
#include "model/ops/topk.h"
#include "model/ops/torch_sum.h"

using namespace dsv41;
using namespace dsv41::model;

TEST(Quant, Pow2CeilScale) {
  EXPECT_EQ(pow2_ceil_scale(448.0f, kFp8MaxInv), 1.0f);
  EXPECT_EQ(pow2_ceil_scale(449.0f, kFp8MaxInv), 2.0f);
  EXPECT_EQ(pow2_ceil_scale(224.0f, kFp8MaxInv), 0.5f);
  EXPECT_EQ(pow2_ceil_scale(6.0f, kFp4MaxInv), 1.0f);
  EXPECT_EQ(pow2_ceil_scale(6.5f, kFp4MaxInv), 2.0f);
}

TEST(Quant, ActQuant8BlockScaleAndTies) {
  std::vector<float> x(64, 0.0f), codes(64), scales(2);
  x[0] = 896.0f;             // block 0: amax 896 -> scale 2
  x[1] = 2.0f * 1.0625f;     // 1.0625 is halfway between e4m3 1.0 and 1.125: ties to even (1.0)
  x[2] = -2.0f * 1.1875f;    // halfway between 1.125 and 1.25: ties to even (1.25)
  x[32] = 1e-6f;             // block 1: amax clamps to 1e-4
  act_quant8(x.data(), 64, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 2.0f);
  EXPECT_EQ(codes[0], 448.0f);
  EXPECT_EQ(codes[1], 1.0f);
  EXPECT_EQ(codes[2], -1.25f);
  EXPECT_EQ(scales[1], pow2_ceil_scale(1e-4f, kFp8MaxInv));
  std::vector<float> y = x;
  qdq8_inplace(y.data(), 64);
  EXPECT_EQ(y[1], 2.0f);
  EXPECT_EQ(y[2], -2.5f);
}

TEST(Quant, E2m1TiesToEvenCode) {
  const std::pair<float, float> cases[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                                           {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},  {0.26f, 0.5f},
                                           {5.1f, 6.0f},  {-0.75f, -1.0f}, {-3.5f, -4.0f}, {2.9f, 3.0f}};
  for (auto [in, out] : cases) EXPECT_EQ(e2m1_round(in), out) << in;
}

TEST(Quant, Qdq4aAndQdq4b) {
  std::vector<float> a(32, 0.0f);
  a[0] = 6.0f;   // scale 1
  a[1] = 0.75f;  // -> 1
  a[2] = 2.5f;   // -> 2
  a[3] = -3.5f;  // -> -4
  qdq4a_inplace(a.data(), 32);
  EXPECT_EQ(a[0], 6.0f);
  EXPECT_EQ(a[1], 1.0f);
  EXPECT_EQ(a[2], 2.0f);
  EXPECT_EQ(a[3], -4.0f);
  std::vector<float> b(16, 0.0f);
  b[0] = 7.0f;  // scale = e4m3(7/6) = 1.125; 7/1.125 = 6.22 -> clamp 6 -> 6.75
  b[1] = 1.125f * 1.25f;  // exactly 1.25 steps -> ties to 1
  qdq4b_inplace(b.data(), 16);
  EXPECT_EQ(b[0], 6.75f);
  EXPECT_EQ(b[1], 1.125f);
}

TEST(Rope, PlainAndYarnTables) {
  RopeTable plain(64, 10000.0, 0, 1.0, 32, 1);
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(plain.freqs()[i], std::pow(10000.0, -2.0 * i / 64), 1e-6 * std::pow(10000.0, -2.0 * i / 64));
  // Released compressed table: low = 15, high = 25 (MODEL.md §4).
  RopeTable base(64, 160000.0, 0, 1.0, 32, 1);
  RopeTable yarn(64, 160000.0, 65536, 16.0, 32, 1);
  for (int i = 0; i < 32; ++i) {
    if (i <= 15) EXPECT_EQ(yarn.freqs()[i], base.freqs()[i]) << i;
    else if (i >= 25) EXPECT_EQ(yarn.freqs()[i], base.freqs()[i] / 16.0f) << i;
    else {
      const double ramp = (i - 15) / 10.0;
      EXPECT_NEAR(yarn.freqs()[i], base.freqs()[i] / 16.0 * ramp + base.freqs()[i] * (1 - ramp),
                  1e-6 * base.freqs()[i]);
    }
  }
  // Rotation then inverse rotation returns the input up to bf16 rounding.
  std::vector<float> v(64), w;
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (float& f : v) f = bf16_round(nd(g));
  w = v;
  yarn.apply(w.data(), 12345);
  EXPECT_NE(w, v);
  yarn.apply(w.data(), 12345, true);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(w[i], v[i], 0.02f * std::fabs(v[i]) + 1e-3f);
}

TEST(Mhc, SinkhornIsDoublyStochastic) {
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  std::vector<float> mixes(24), base(24), scale = {0.5f, 0.7f, 1.3f};
  for (float& f : mixes) f = nd(g);
  for (float& f : base) f = nd(g);
  HcMix m;
  hc_split_sinkhorn(mixes.data(), 4, base.data(), scale.data(), 20, 1e-6, m);
  // Independent double-precision run of the same iteration (row softmax + eps, column
  // normalisation, then 19 x (row, column)).
  double c[4][4];
  for (int r = 0; r < 4; ++r) {
    double mx = -1e300, s = 0;
    for (int k = 0; k < 4; ++k) mx = std::max(mx, double(mixes[8 + r * 4 + k]) * 1.3 + base[8 + r * 4 + k]);
    for (int k = 0; k < 4; ++k) s += (c[r][k] = std::exp(double(mixes[8 + r * 4 + k]) * 1.3 + base[8 + r * 4 + k] - mx));
    for (int k = 0; k < 4; ++k) c[r][k] = c[r][k] / s + 1e-6;
  }
  auto cols = [&] {
    for (int k = 0; k < 4; ++k) {
      double s = 0;
      for (int r = 0; r < 4; ++r) s += c[r][k];
      for (int r = 0; r < 4; ++r) c[r][k] /= s + 1e-6;
    }
  };
  cols();
  for (int it = 0; it < 19; ++it) {
    for (int r = 0; r < 4; ++r) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += c[r][k];
      for (int k = 0; k < 4; ++k) c[r][k] /= s + 1e-6;
    }
    cols();
  }
  for (int k = 0; k < 4; ++k) {
    float col = 0;
    for (int j = 0; j < 4; ++j) {
      col += m.comb[j * 4 + k];
      EXPECT_NEAR(m.comb[j * 4 + k], c[j][k], 1e-5) << j << "," << k;
    }
    EXPECT_NEAR(col, 1.0f, 1e-4f);  // ends with a column normalisation
    EXPECT_GT(m.pre[k], 0.0f);
    EXPECT_LT(m.pre[k], 1.0f + 2e-6f);
    EXPECT_GT(m.post[k], 0.0f);
    EXPECT_LT(m.post[k], 2.0f);
  }
  // pre = sigmoid(m·s0 + b) + eps
  EXPECT_NEAR(m.pre[0], 1.0f / (1.0f + std::exp(-(mixes[0] * 0.5f + base[0]))) + 1e-6f, 1e-6f);
}

TEST(Reduction, TorchSumOrder) {
  std::vector<float> x(1024);
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  double ref = 0;
  for (float& f : x) ref += (f = nd(g));
  EXPECT_NEAR(torch_sum_f32(x.data(), 1024), ref, 1e-3);
  // Fewer values than one vector: a plain left-to-right sum.
  const float s = torch_sum_f32(x.data(), 5);
  EXPECT_EQ(s, (((x[0] + x[1]) + x[2]) + x[3]) + x[4]);
}

TEST(TopK, SelectsLargest) {
  std::vector<float> v = {0.5f, 3.0f, -1.0f, 2.0f, -INFINITY, 7.0f};
  auto idx = torch_topk_indices(v, 3);
  std::sort(idx.begin(), idx.end());
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 5}));
}

// MODEL.md §3.5: primes, row totals and numpy-PCG64 multipliers of the released config.
TEST(Engram, ReleasedPrimesAndMultipliers) {
  ModelConfig c;
  c.engram_layer_ids = {1, 14};
  c.engram_num_embeddings = {384006168, 384016682};
  c.engram_max_ngram_size = 4;
  c.engram_n_heads = 8;
  c.engram_vocab_size = 16000000;
  c.engram_compressed_vocab_size = 99092;
  const auto h = build_engram_hashes(c);
  ASSERT_EQ(h.size(), 2u);
  const std::vector<int64_t> p1 = {16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
                                   16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
                                   16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463};
  const std::vector<int64_t> p14 = {16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
                                    16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
                                    16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
  EXPECT_EQ(h[0].primes, p1);
  EXPECT_EQ(h[1].primes, p14);
  EXPECT_EQ(h[0].offsets[1], 16000057);
  EXPECT_EQ(h[0].total_rows, 384006168);
  EXPECT_EQ(h[1].total_rows, 384016682);
  EXPECT_EQ(h[0].multipliers, (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(h[1].multipliers, (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  // A wrong row count in the config is refused.
  c.engram_num_embeddings[1] += 1;
  EXPECT_THROW(build_engram_hashes(c), dsv41::Error);
}

TEST(Engram, HashOfPaddedHistory) {
  ModelConfig c;
  c.engram_layer_ids = {0};
  c.engram_num_embeddings = {660};
  c.engram_max_ngram_size = 4;
  c.engram_n_heads = 2;
  c.engram_vocab_size = 100;
  c.engram_compressed_vocab_size = 256;
  const auto h = build_engram_hashes(c);
  EXPECT_EQ(h[0].primes, (std::vector<int64_t>{101, 103, 107, 109, 113, 127}));
  // History [5, <start>, ...]: tokens after the start are the pad id (1 here).
  const int64_t hist[4] = {5, -1, -1, -1};
  int64_t rows[6];
  engram_hash_ids(h[0], c, hist, 1, rows);
  const auto& M = h[0].multipliers;
  int64_t r = 5 * M[0];
  for (int k = 1; k < 4; ++k) {
    r ^= 1 * M[k];
    for (int head = 0; head < 2; ++head) {
      const int col = (k - 1) * 2 + head;
      EXPECT_EQ(rows[col], h[0].offsets[col] + r % h[0].primes[col]);
    }
  }
}
