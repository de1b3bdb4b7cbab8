// Engram geometry and the tensor-parallel row split (include/dsv41/engram/geometry.h).
#include <gtest/gtest.h>

#include <numeric>

#include "dsv41/engram/geometry.h"
#include "dsv41/engram/xxhash64.h"
#include "model/engram_hash.h"
#include "split_fixture.h"

namespace dsv41::engram {
namespace {

ModelConfig released_config() { return load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json"); }

TEST(EngramGeometry, ReleasedConfigMatchesTheSpecPrimes) {
  const auto g = EngramGeometry::from_config(released_config());
  ASSERT_EQ(g.n_layers(), 2);
  EXPECT_EQ(g.head_dim, 256);
  EXPECT_EQ(g.scale_bytes, 8);
  EXPECT_EQ(g.row_bytes, 264);
  EXPECT_EQ(g.rows[0], 384006168);
  EXPECT_EQ(g.rows[1], 384016682);
  // MODEL.md §3.5, layer 1 primes (column order).
  const std::vector<int64_t> l1 = {16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
                                   16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
                                   16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463};
  ASSERT_EQ(g.n_columns(), 24);
  for (size_t c = 0; c < l1.size(); ++c) EXPECT_EQ(g.column_offsets[0][c + 1] - g.column_offsets[0][c], l1[c]) << c;
  // Two ranks: rank 0 owns columns 0..11 = the first 12 primes' rows.
  const auto s0 = engram_share(g, 0, 0, 2), s1 = engram_share(g, 0, 1, 2);
  EXPECT_EQ(s0.col_begin, 0);
  EXPECT_EQ(s0.col_end, 12);
  EXPECT_EQ(s0.row_end, std::accumulate(l1.begin(), l1.begin() + 12, int64_t{0}));
  EXPECT_EQ(s1.row_begin, s0.row_end);
  EXPECT_EQ(s1.row_end, 384006168);
}

TEST(EngramGeometry, OffsetsAgreeWithTheEngineHashLayout) {
  for (const ModelConfig& c : {released_config(), load_model_config(test::fixture_model("tiny-s0") + "/config.json"),
                               load_model_config(test::fixture_model("tiny-long") + "/config.json")}) {
    const auto g = EngramGeometry::from_config(c);
    const auto h = model::build_engram_hashes(c);
    ASSERT_EQ(static_cast<int64_t>(h.size()), g.n_layers());
    for (size_t l = 0; l < h.size(); ++l) {
      ASSERT_EQ(static_cast<int64_t>(h[l].offsets.size()), g.n_columns());
      for (int64_t col = 0; col < g.n_columns(); ++col)
        EXPECT_EQ(h[l].offsets[static_cast<size_t>(col)], g.column_offsets[l][static_cast<size_t>(col)]);
      EXPECT_EQ(h[l].total_rows, g.rows[l]);
    }
  }
}

TEST(EngramGeometry, TinyConfigWidthsComeFromHeadDim) {
  const auto c = load_model_config(test::fixture_model("tiny-s0") + "/config.json");
  const auto g = EngramGeometry::from_config(c);
  EXPECT_EQ(g.head_dim, c.engram_head_dim);
  EXPECT_EQ(g.scale_bytes, (c.engram_head_dim + 31) / 32);
  EXPECT_EQ(g.row_bytes, g.head_dim + g.scale_bytes);
}

TEST(EngramGeometry, SharesPartitionEveryTableForAnyWorldSize) {
  for (const ModelConfig& c : {released_config(), load_model_config(test::fixture_model("tiny-s0") + "/config.json")}) {
    const auto g = EngramGeometry::from_config(c);
    for (int world = 1; world <= 30; ++world)
      for (int64_t l = 0; l < g.n_layers(); ++l) {
        int64_t next = 0, max_cols = 0, min_cols = g.n_columns();
        for (int r = 0; r < world; ++r) {
          const auto s = engram_share(g, l, r, world);
          EXPECT_EQ(s.row_begin, next) << "world " << world << " rank " << r;
          EXPECT_EQ(s.row_begin, g.column_offsets[l][s.col_begin]);
          EXPECT_EQ(s.row_end, g.column_offsets[l][s.col_end]);
          next = s.row_end;
          max_cols = std::max(max_cols, s.col_end - s.col_begin);
          min_cols = std::min(min_cols, s.col_end - s.col_begin);
          if (s.n_rows() > 0) {
            EXPECT_EQ(engram_row_owner(g, l, s.row_begin, world), r);
            EXPECT_EQ(engram_row_owner(g, l, s.row_end - 1, world), r);
          }
        }
        EXPECT_EQ(next, g.rows[l]) << "world " << world;
        EXPECT_LE(max_cols - min_cols, 1) << "columns are balanced to within one";
      }
  }
}

TEST(EngramGeometry, BadRankAndInconsistentConfigAreErrors) {
  auto c = load_model_config(test::fixture_model("tiny-s0") + "/config.json");
  const auto g = EngramGeometry::from_config(c);
  EXPECT_THROW(engram_share(g, 0, 2, 2), Error);
  EXPECT_THROW(engram_share(g, 0, 0, 0), Error);
  EXPECT_THROW(engram_share(g, 5, 0, 1), Error);
  c.engram_num_embeddings[0] += 1;
  try {
    EngramGeometry::from_config(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engram_num_embeddings[0]"), std::string::npos) << e.what();
  }
}

// Reference values computed with the xxHash project's own library (xxhsum 0.8.1).
TEST(Xxh64, KnownVectorsAndStreaming) {
  EXPECT_EQ(Xxh64::of("", 0), 0xEF46DB3751D8E999ULL);
  const std::string abc = "abc";
  EXPECT_EQ(Xxh64::of(abc.data(), abc.size()), 0x44BC2CF5AD770999ULL);
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31 + 7);
  const uint64_t whole = Xxh64::of(data.data(), data.size());
  EXPECT_EQ(whole, 0x99594F4828043D35ULL);
  EXPECT_EQ(Xxh64::of(data.data(), 17), 0xFE9F0FEB7EEEDC09ULL);
  for (size_t step : {1u, 3u, 31u, 32u, 33u, 100u}) {
    Xxh64 h;
    for (size_t i = 0; i < data.size(); i += step) h.update(&data[i], std::min(step, data.size() - i));
    EXPECT_EQ(h.digest(), whole) << step;
  }
}

}  // namespace
}  // namespace dsv41::engram
