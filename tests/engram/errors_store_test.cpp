// Start-up validation errors, runtime I/O errors, and the row store (prefetch, dedup, cache,
// metrics), plus the pack-engram command line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <random>

#include "dsv41/engram/pack.h"
#include "dsv41/engram/row_source.h"
#include "dsv41/engram/row_store.h"
#include "split_fixture.h"
#include "../support/run_cli.h"

namespace dsv41::engram {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

struct EngramErrorsAndStore : ::testing::Test {
  TempDir tmp;
  test::SplitModel m;
  void SetUp() override { m = test::make_split_model(tmp.path()); }
  PackResult pack(const std::string& out, int rank, int world) const {
    PackOptions o;
    o.engram_dir = m.engram_dir;
    o.out_dir = out;
    o.rank = rank;
    o.world_size = world;
    o.progress = false;
    return pack_engram(m.geo, o);
  }
};

TEST_F(EngramErrorsAndStore, MissingShard) {
  fs::remove(m.engram_dir + "/" + m.engram_shards[1]);
  const std::string e = error_of([&] { open_safetensors_dir_source(m.engram_dir, m.geo); });
  EXPECT_HAS(e, m.engram_shards[1]);
  EXPECT_HAS(e, "missing");
  EXPECT_HAS(error_of([&] { pack(tmp.sub("p"), 0, 1); }), "missing");
}

TEST_F(EngramErrorsAndStore, TruncatedShardAtStartUp) {
  const std::string shard = m.engram_dir + "/" + m.engram_shards[0];
  fs::resize_file(shard, fs::file_size(shard) - 5);
  const std::string e = error_of([&] { open_safetensors_dir_source(m.engram_dir, m.geo); });
  EXPECT_HAS(e, "truncated");
  EXPECT_HAS(e, m.engram_shards[0]);
}

TEST_F(EngramErrorsAndStore, ShortReadAtRunTimeFailsOnlyThatRequest) {
  for (bool direct : {true, false}) {
    TempDir t2;
    auto mm = test::make_split_model(t2.path());
    EngramStore store(open_safetensors_dir_source(mm.engram_dir, mm.geo, {.direct_io = direct}), {.io_threads = 4});
    const std::string shard = mm.engram_dir + "/" + mm.engram_shards[0];
    // The shard shrinks under a running server: the last rows of layer 0's scale are gone.
    fs::resize_file(shard, fs::file_size(shard) - 3);
    const int64_t last = mm.geo.rows[0] - 1;
    std::vector<uint8_t> row(static_cast<size_t>(mm.geo.row_bytes));
    const std::string e = error_of([&] { store.read_rows(0, std::span<const int64_t>(&last, 1), row.data()); });
    EXPECT_HAS(e, "short read");
    EXPECT_EQ(store.metrics().read_errors, 1u);
    // The store keeps serving other rows (layer 1 lives in another shard; row 0 of layer 0 is intact).
    const int64_t ok = 0;
    EXPECT_NO_THROW(store.read_rows(1, std::span<const int64_t>(&ok, 1), row.data()));
    EXPECT_NO_THROW(store.read_rows(0, std::span<const int64_t>(&ok, 1), row.data()));
  }
}

TEST_F(EngramErrorsAndStore, WrongRowCountForTheConfig) {
  // Rewrite layer 0's shard with one row fewer than engram_num_embeddings[0].
  auto ck = Checkpoint::open(test::fixture_model("tiny-s0"));
  const int64_t id = m.geo.layer_ids[0], rows = m.geo.rows[0] - 1;
  const TensorInfo& w = ck->get(fmt::format("layers.{}.engram.embed.weight", id));
  const TensorInfo& s = ck->get(fmt::format("layers.{}.engram.embed.scale", id));
  SafetensorsWriter wr;
  wr.add(w.name, w.dtype, {rows, m.geo.head_dim}, w.data, static_cast<size_t>(rows * m.geo.head_dim));
  wr.add(s.name, s.dtype, {rows, m.geo.scale_bytes}, s.data, static_cast<size_t>(rows * m.geo.scale_bytes));
  wr.write(m.engram_dir + "/" + m.engram_shards[0]);
  const std::string e = error_of([&] { open_safetensors_dir_source(m.engram_dir, m.geo); });
  EXPECT_HAS(e, fmt::format("[{}, {}]", m.geo.rows[0], m.geo.head_dim));
  EXPECT_HAS(e, "wrong table");
}

TEST_F(EngramErrorsAndStore, IndexWithoutTheEngramTensor) {
  std::ifstream in(m.engram_dir + "/model.safetensors.index.json");
  auto j = nlohmann::json::parse(in);
  j["weight_map"].erase(fmt::format("layers.{}.engram.embed.scale", m.geo.layer_ids[1]));
  std::ofstream(m.engram_dir + "/model.safetensors.index.json") << j.dump();
  EXPECT_HAS(error_of([&] { open_safetensors_dir_source(m.engram_dir, m.geo); }), "no entry for");
}

TEST_F(EngramErrorsAndStore, CorruptedPackedFileIsAChecksumMismatch) {
  const auto r = pack(tmp.sub("p"), 1, 2);
  {
    std::fstream f(r.files[1], std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(100);
    const char c = static_cast<char>(f.get());
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x10));
  }
  const std::string e = error_of([&] { open_packed_source(tmp.sub("p"), m.geo, 1, 2); });
  EXPECT_HAS(e, "checksum mismatch");
  EXPECT_HAS(e, fs::path(r.files[1]).filename().string());
}

TEST_F(EngramErrorsAndStore, TruncatedOrMissingPackedFile) {
  const auto r = pack(tmp.sub("p"), 0, 1);
  fs::resize_file(r.files[0], fs::file_size(r.files[0]) - 1);
  EXPECT_HAS(error_of([&] { open_packed_source(tmp.sub("p"), m.geo, 0, 1); }), "truncated");
  fs::remove(r.files[0]);
  EXPECT_HAS(error_of([&] { open_packed_source(tmp.sub("p"), m.geo, 0, 1); }), "missing");
  EXPECT_HAS(error_of([&] { open_packed_source(tmp.sub("p"), m.geo, 0, 2); }), "pack-engram");
  // A pack of another world size is not mistaken for this one.
  EXPECT_HAS(error_of([&] { open_packed_source(tmp.sub("nothing"), m.geo, 0, 0); }), "not a directory");
}

TEST_F(EngramErrorsAndStore, PackForAnotherGeometryIsRefused) {
  pack(tmp.sub("p"), 0, 1);
  auto cfg = m.cfg;
  cfg.engram_head_dim = 64;
  const auto g2 = EngramGeometry::from_config(cfg);
  EXPECT_HAS(error_of([&] { open_packed_source(tmp.sub("p"), g2, 0, 1); }), "geometry");
}

// ---- the store ----

TEST_F(EngramErrorsAndStore, StoreDeduplicatesCachesAndCounts) {
  auto ck = Checkpoint::open(test::fixture_model("tiny-s0"));
  const double row_gib = static_cast<double>(m.geo.row_bytes) / 1073741824.0;
  EngramStore store(open_safetensors_dir_source(m.engram_dir, m.geo), {.cache_gib = 1000 * row_gib, .io_threads = 8});
  ASSERT_EQ(store.metrics().cache_capacity_rows, 1000u);
  std::mt19937 rng(7);
  std::vector<int64_t> ids(400);
  for (auto& v : ids) v = static_cast<int64_t>(rng() % 50);  // heavy repetition
  const size_t distinct = std::set<int64_t>(ids.begin(), ids.end()).size();
  auto f = store.prefetch(1, ids);
  EXPECT_EQ(f->unique_rows(), distinct);
  std::vector<uint8_t> got(ids.size() * static_cast<size_t>(m.geo.row_bytes));
  f->copy_rows(ids, got.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto want = test::original_row(*ck, m.geo, 1, ids[i]);
    ASSERT_EQ(0, std::memcmp(want.data(), &got[i * static_cast<size_t>(m.geo.row_bytes)], want.size())) << i;
  }
  auto m1 = store.metrics();
  EXPECT_EQ(m1.rows_requested, ids.size());
  EXPECT_EQ(m1.rows_unique, distinct);
  EXPECT_EQ(m1.cache_misses, distinct);
  EXPECT_EQ(m1.cache_hits, 0u);
  EXPECT_EQ(m1.rows_read, distinct);
  EXPECT_EQ(m1.bytes_read, distinct * static_cast<uint64_t>(m.geo.row_bytes));
  uint64_t n_lat = 0;
  for (auto b : m1.latency_buckets) n_lat += b;
  EXPECT_EQ(n_lat, distinct);
  // The same rows again: all from the cache, identical bytes.
  std::vector<uint8_t> again(got.size());
  store.read_rows(1, ids, again.data());
  EXPECT_EQ(again, got);
  auto m2 = store.metrics();
  EXPECT_EQ(m2.cache_hits, distinct);
  EXPECT_EQ(m2.rows_read, distinct);
  EXPECT_DOUBLE_EQ(m2.cache_hit_rate, 0.5);
  EXPECT_EQ(m2.cache_rows, distinct);
  const std::string text = format_engram_metrics(m2);
  EXPECT_HAS(text, fmt::format("dsv41_engram_cache_hits_total {}\n", distinct));
  EXPECT_HAS(text, fmt::format("dsv41_engram_read_latency_seconds_count {}\n", distinct));
  EXPECT_HAS(text, "dsv41_engram_rows_per_second");
}

// A source over the real shards whose reads of one row block until the test opens a gate, and
// which says when a read of that row has begun.
struct GatedSource : EngramRowSource {
  std::unique_ptr<EngramRowSource> inner;
  int64_t gated_row;
  mutable std::promise<void> started;  // set by the first read of gated_row (the test reads it once)
  std::promise<void> gate;
  std::shared_future<void> open{gate.get_future().share()};
  GatedSource(std::unique_ptr<EngramRowSource> s, int64_t row) : inner(std::move(s)), gated_row(row) {}
  const EngramGeometry& geometry() const override { return inner->geometry(); }
  bool covers(int64_t layer, int64_t row) const override { return inner->covers(layer, row); }
  void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) const override {
    for (int64_t id : ids)
      if (id == gated_row) {
        started.set_value();
        open.wait();
      }
    inner->read_rows(layer, ids, out);
  }
  std::string describe() const override { return "gated " + inner->describe(); }
};

// The waiting thread reads its fetch's queued rows itself: with the only I/O worker blocked inside
// another fetch's read, a second fetch still completes (it would wait forever on the worker).
TEST_F(EngramErrorsAndStore, WaitingThreadReadsItsQueuedRows) {
  auto ck = Checkpoint::open(test::fixture_model("tiny-s0"));
  auto src = std::make_shared<GatedSource>(open_safetensors_dir_source(m.engram_dir, m.geo), 0);
  EngramStore store(src, {.io_threads = 1});
  const std::vector<int64_t> first = {0}, second = {5, 3, 9, 3};
  auto f1 = store.prefetch(0, first);
  src->started.get_future().wait();  // the worker is inside row 0's read
  auto f2 = store.prefetch(0, second);
  std::vector<uint8_t> got(second.size() * static_cast<size_t>(m.geo.row_bytes));
  auto waiting = std::async(std::launch::async, [&] { f2->copy_rows(second, got.data()); });
  EXPECT_EQ(waiting.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the second fetch waited for the blocked worker";
  EXPECT_FALSE(f1->ready());
  src->gate.set_value();  // (also ends a wait that did not read its own rows)
  waiting.get();
  for (size_t i = 0; i < second.size(); ++i) {
    const auto want = test::original_row(*ck, m.geo, 0, second[i]);
    EXPECT_EQ(0, std::memcmp(want.data(), &got[i * static_cast<size_t>(m.geo.row_bytes)], want.size())) << i;
  }
  std::vector<uint8_t> row0(static_cast<size_t>(m.geo.row_bytes));
  f1->copy_rows(first, row0.data());
  const auto want0 = test::original_row(*ck, m.geo, 0, 0);
  EXPECT_EQ(0, std::memcmp(want0.data(), row0.data(), want0.size()));
}

// A source that says how many concurrent reads it can use.
struct CappedSource : EngramRowSource {
  std::unique_ptr<EngramRowSource> inner;
  int cap;
  CappedSource(std::unique_ptr<EngramRowSource> s, int c) : inner(std::move(s)), cap(c) {}
  const EngramGeometry& geometry() const override { return inner->geometry(); }
  bool covers(int64_t layer, int64_t row) const override { return inner->covers(layer, row); }
  void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) const override {
    inner->read_rows(layer, ids, out);
  }
  std::string describe() const override { return "capped " + inner->describe(); }
  int max_useful_readers() const override { return cap; }
};

// The store runs the smaller of its configured readers and the source's cap (0: none); the
// memory-mapped checkpoint source is capped (its reads are copies, not I/O), the positioned-read
// sources are not. Rows read through a capped store are still every requested row.
TEST_F(EngramErrorsAndStore, ReaderThreadsFollowTheSourcesCap) {
  auto ck = Checkpoint::open(test::fixture_model("tiny-s0"));
  EXPECT_EQ(EngramStore(std::make_shared<CappedSource>(open_safetensors_dir_source(m.engram_dir, m.geo), 3),
                        {.io_threads = 64})
                .io_threads(),
            3);
  EXPECT_EQ(EngramStore(std::make_shared<CappedSource>(open_safetensors_dir_source(m.engram_dir, m.geo), 3),
                        {.io_threads = 2})
                .io_threads(),
            2);
  EXPECT_EQ(EngramStore(std::make_shared<CappedSource>(open_safetensors_dir_source(m.engram_dir, m.geo), 0),
                        {.io_threads = 64})
                .io_threads(),
            64);
  EXPECT_EQ(EngramStore(open_safetensors_dir_source(m.engram_dir, m.geo), {.io_threads = 64}).io_threads(), 64);
  const std::shared_ptr<const EngramRowSource> mapped = open_checkpoint_source(*ck, m.geo);
  EXPECT_GT(mapped->max_useful_readers(), 0);
  EngramStore store(mapped, {.io_threads = 64});
  EXPECT_EQ(store.io_threads(), mapped->max_useful_readers());
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < m.geo.rows[0]; r += 7) ids.push_back(r);
  std::vector<uint8_t> got(ids.size() * static_cast<size_t>(m.geo.row_bytes));
  store.read_rows(0, ids, got.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto want = test::original_row(*ck, m.geo, 0, ids[i]);
    ASSERT_EQ(0, std::memcmp(want.data(), &got[i * static_cast<size_t>(m.geo.row_bytes)], want.size())) << ids[i];
  }
}

TEST_F(EngramErrorsAndStore, BoundedCacheEvictsAndStaysCorrect) {
  auto ck = Checkpoint::open(test::fixture_model("tiny-s0"));
  const double row_gib = static_cast<double>(m.geo.row_bytes) / 1073741824.0;
  EngramStore store(open_safetensors_dir_source(m.engram_dir, m.geo, {.direct_io = false}),
                    {.cache_gib = 64 * row_gib, .io_threads = 3});
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    std::vector<int64_t> ids(60);
    for (auto& v : ids) v = static_cast<int64_t>(rng() % static_cast<uint32_t>(m.geo.rows[0]));
    std::vector<uint8_t> got(ids.size() * static_cast<size_t>(m.geo.row_bytes));
    store.read_rows(0, ids, got.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto want = test::original_row(*ck, m.geo, 0, ids[i]);
      ASSERT_EQ(0, std::memcmp(want.data(), &got[i * static_cast<size_t>(m.geo.row_bytes)], want.size()));
    }
    ASSERT_LE(store.metrics().cache_rows, 64u);
  }
  EXPECT_EQ(store.metrics().cache_rows, 64u);
  EXPECT_GT(store.metrics().cache_hits, 0u);
}

TEST_F(EngramErrorsAndStore, PrefetchRejectsRowsOutsideTheTableOrThePack) {
  EngramStore store(open_safetensors_dir_source(m.engram_dir, m.geo));
  const int64_t bad = m.geo.rows[0];
  EXPECT_HAS(error_of([&] { store.prefetch(0, std::span<const int64_t>(&bad, 1)); }), "out of range");
  EXPECT_HAS(error_of([&] { store.prefetch(2, {}); }), "layer index");
  pack(tmp.sub("p"), 0, 2);
  EngramStore rank0(open_packed_source(tmp.sub("p"), m.geo, 0, 2));
  const int64_t foreign = engram_share(m.geo, 0, 1, 2).row_begin;
  EXPECT_HAS(error_of([&] { rank0.prefetch(0, std::span<const int64_t>(&foreign, 1)); }), "not held by");
}

// ---- command line ----

using ::dsv41::test::CliResult;
CliResult run_cli(const std::string& args) { return ::dsv41::test::run_cli(args, ::dsv41::test::Stderr::kMerge); }

TEST_F(EngramErrorsAndStore, PackEngramCommandLine) {
  const std::string out = tmp.sub("cli");
  auto r = run_cli("pack-engram --engram-dir " + m.engram_dir + " --rank 1 --world-size 2 --out " + out +
                   " --max-rows 10 --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j1 = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j1["complete"], false);
  EXPECT_EQ(j1["rows_written"], 10);
  r = run_cli("pack-engram --engram-dir " + m.engram_dir + " --rank 1 --world-size 2 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_HAS(r.out, "100.00%");  // the progress bar (stderr)
  EXPECT_HAS(r.out, "MB/s");
  const auto j2 = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j2["complete"], true);
  EXPECT_EQ(j2["rows_resumed"], 10);
  EXPECT_NO_THROW(open_packed_source(out, m.geo, 1, 2));
  fs::remove(m.engram_dir + "/" + m.engram_shards[0]);
  r = run_cli("pack-engram --engram-dir " + m.engram_dir + " --rank 0 --world-size 2 --out " + tmp.sub("cli2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_HAS(r.out, "dsv41-serve: error:");
  EXPECT_HAS(r.out, "missing");
}

}  // namespace
}  // namespace dsv41::engram
