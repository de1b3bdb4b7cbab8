// Engram row sources, packing and the row store, on tiny-s0 with its Engram tables moved into
// shards of their own. The oracle is the original checkpoint's table tensors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <random>

#include "dsv41/common/numeric.h"
#include "dsv41/engram/pack.h"
#include "dsv41/engram/row_source.h"
#include "dsv41/engram/row_store.h"
#include "split_fixture.h"

namespace dsv41::engram {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

struct EngramSources : ::testing::Test {
  TempDir tmp;
  test::SplitModel m;
  std::unique_ptr<Checkpoint> orig;
  void SetUp() override {
    m = test::make_split_model(tmp.path());
    orig = Checkpoint::open(test::fixture_model("tiny-s0"));
  }
  std::vector<int64_t> all_rows(int64_t layer) const {
    std::vector<int64_t> ids(static_cast<size_t>(m.geo.rows[static_cast<size_t>(layer)]));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    return ids;
  }
  // Every row of every layer from `src` equals the original tensors' row.
  void expect_all_rows_equal(const EngramRowSource& src) const {
    for (int64_t l = 0; l < m.geo.n_layers(); ++l) {
      const auto ids = all_rows(l);
      std::vector<uint8_t> got(ids.size() * static_cast<size_t>(m.geo.row_bytes));
      src.read_rows(l, ids, got.data());
      for (int64_t r : ids) {
        const auto want = test::original_row(*orig, m.geo, l, r);
        ASSERT_EQ(0, std::memcmp(want.data(), &got[static_cast<size_t>(r * m.geo.row_bytes)], want.size()))
            << src.describe() << " layer " << l << " row " << r;
      }
    }
  }
  PackResult pack(const std::string& out, int rank, int world, int64_t max_rows = -1, int64_t chunk = 37) const {
    PackOptions o;
    o.engram_dir = m.engram_dir;
    o.out_dir = out;
    o.rank = rank;
    o.world_size = world;
    o.max_rows = max_rows;
    o.chunk_rows = chunk;
    o.commit_bytes = 1;  // commit after every chunk
    o.progress = false;
    return pack_engram(m.geo, o);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(EngramSources, CheckpointSourceMatchesTheTensors) {
  auto src = open_checkpoint_source(*orig, m.geo);
  expect_all_rows_equal(*src);
}

TEST_F(EngramSources, SafetensorsDirSourceMatchesWithDirectAndBufferedIo) {
  for (bool direct : {true, false}) {
    auto src = open_safetensors_dir_source(m.engram_dir, m.geo, {.direct_io = direct});
    expect_all_rows_equal(*src);
  }
}

TEST_F(EngramSources, DequantMatchesTheLoaderConversion) {
  // bf16(e4m3 × 2^(scale−127)) through the loader's generic tensor_to_f32 conversions.
  for (int64_t l = 0; l < m.geo.n_layers(); ++l) {
    const int64_t id = m.geo.layer_ids[static_cast<size_t>(l)];
    const auto w = tensor_to_f32(orig->get(fmt::format("layers.{}.engram.embed.weight", id)));
    const auto s = tensor_to_f32(orig->get(fmt::format("layers.{}.engram.embed.scale", id)));
    auto src = open_safetensors_dir_source(m.engram_dir, m.geo);
    EngramStore store(std::move(src));
    const auto ids = all_rows(l);
    std::vector<float> got(ids.size() * static_cast<size_t>(m.geo.head_dim));
    store.read_dequant(l, ids, got.data());
    for (int64_t r : ids)
      for (int64_t d = 0; d < m.geo.head_dim; ++d) {
        const float want = bf16_round(w[r * m.geo.head_dim + d] * s[r * m.geo.scale_bytes + d / 32]);
        ASSERT_EQ(want, got[r * m.geo.head_dim + d]) << "row " << r << " d " << d;
      }
  }
}

TEST_F(EngramSources, PackedFilesAreTheOriginalSlicesAtWorldSizeOneAndTwo) {
  for (int world : {1, 2}) {
    const std::string out = tmp.sub("pack" + std::to_string(world));
    for (int rank = 0; rank < world; ++rank) {
      const auto res = pack(out, rank, world);
      ASSERT_TRUE(res.complete);
      EXPECT_EQ(res.rows_resumed, 0);
      for (int64_t l = 0; l < m.geo.n_layers(); ++l) {
        const auto share = engram_share(m.geo, l, rank, world);
        std::ifstream f(res.files[static_cast<size_t>(l)], std::ios::binary);
        std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
        ASSERT_EQ(bytes.size(), static_cast<size_t>(share.n_rows() * m.geo.row_bytes));
        for (int64_t r = share.row_begin; r < share.row_end; ++r) {
          const auto want = test::original_row(*orig, m.geo, l, r);
          ASSERT_EQ(0, std::memcmp(want.data(), &bytes[static_cast<size_t>((r - share.row_begin) * m.geo.row_bytes)],
                                   want.size()))
              << "world " << world << " rank " << rank << " layer " << l << " row " << r;
        }
      }
      // One rank's source serves exactly its share.
      auto src = open_packed_source(out, m.geo, rank, world);
      for (int64_t l = 0; l < m.geo.n_layers(); ++l) {
        const auto share = engram_share(m.geo, l, rank, world);
        for (int64_t r = 0; r < m.geo.rows[static_cast<size_t>(l)]; ++r) ASSERT_EQ(src->covers(l, r), share.contains(r));
        if (world == 2) {
          const int64_t foreign = rank == 0 ? share.row_end : share.row_begin - 1;
          std::vector<uint8_t> row(static_cast<size_t>(m.geo.row_bytes));
          const std::string e = error_of([&] { src->read_rows(l, std::span<const int64_t>(&foreign, 1), row.data()); });
          EXPECT_NE(e.find("belongs to rank"), std::string::npos) << e;
        }
      }
    }
    // All ranks together: the whole table, identical to the original.
    for (bool direct : {true, false}) {
      auto all = open_packed_source(out, m.geo, 0, 0, {.direct_io = direct});
      expect_all_rows_equal(*all);
    }
  }
}

TEST_F(EngramSources, PackingResumesAndVerifies) {
  const std::string ref = tmp.sub("ref"), out = tmp.sub("resumed");
  ASSERT_TRUE(pack(ref, 1, 2).complete);
  const int64_t total = pack(out, 1, 2, 50).rows_total;
  EXPECT_EQ(error_of([&] { open_packed_source(out, m.geo, 1, 2); }).find("incomplete") != std::string::npos, true);
  auto r2 = pack(out, 1, 2, 100);
  EXPECT_FALSE(r2.complete);
  EXPECT_EQ(r2.rows_resumed, 50);
  EXPECT_EQ(r2.rows_written, 100);
  // Garbage after the last commit (a crash mid-write) is dropped on resume.
  {
    std::ofstream f(r2.files[0], std::ios::binary | std::ios::app);
    f << std::string(1000, '\x7f');
  }
  auto r3 = pack(out, 1, 2);
  EXPECT_TRUE(r3.complete);
  EXPECT_EQ(r3.rows_resumed, 150);
  EXPECT_EQ(r3.rows_done, total);
  for (size_t l = 0; l < r3.files.size(); ++l) {
    std::ifstream a(r3.files[l], std::ios::binary), b(pack(ref, 1, 2).files[l], std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));
  }
  EXPECT_NO_THROW(open_packed_source(out, m.geo, 1, 2));  // complete, checksums verified
}

TEST_F(EngramSources, ResumeRepacksACorruptedPrefix) {
  const std::string out = tmp.sub("corrupt");
  auto r1 = pack(out, 0, 1, 120);
  {
    std::fstream f(r1.files[0], std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(5);
    f.put('\x01');
  }
  auto r2 = pack(out, 0, 1);
  EXPECT_TRUE(r2.complete);
  EXPECT_EQ(r2.rows_resumed, 0) << "the corrupted layer was packed again from its start";
  expect_all_rows_equal(*open_packed_source(out, m.geo, 0, 1));
}

}  // namespace
}  // namespace dsv41::engram
