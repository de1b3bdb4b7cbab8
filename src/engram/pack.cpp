#include "dsv41/engram/pack.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "dsv41/common/error.h"
#include "dsv41/common/log.h"
#include "dsv41/engram/row_source.h"
#include "dsv41/engram/xxhash64.h"
#include "engram/pack_format.h"
#include "engram/positioned_file.h"
#include "engram/table_files.h"

namespace dsv41::engram {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

class Progress {
 public:
  Progress(bool on, int64_t total_rows, int64_t row_bytes) : on_(on), total_(total_rows), rb_(row_bytes) {}
  void update(int64_t done_rows, int64_t written_rows, int64_t layer_id, bool force = false) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double secs = std::max(1e-3, std::chrono::duration<double>(now - start_).count());
    const double mbs = static_cast<double>(written_rows) * static_cast<double>(rb_) / secs / 1e6;
    const double pct = total_ ? 100.0 * static_cast<double>(done_rows) / static_cast<double>(total_) : 100.0;
    std::fprintf(stderr, "\rpack-engram: layer %lld  %6.2f%%  %lld/%lld rows  %8.1f MB/s ", static_cast<long long>(layer_id),
                 pct, static_cast<long long>(done_rows), static_cast<long long>(total_), mbs);
    std::fflush(stderr);
  }
  void finish() {
    if (on_) std::fputc('\n', stderr);
  }

 private:
  bool on_;
  int64_t total_, rb_;
  Clock::time_point start_ = Clock::now(), last_{};
};

void write_all(int fd, const std::string& path, const uint8_t* p, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("{}: write failed: {}", path, std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
}

// Verifies a committed prefix: its hash against the index and a few rows against the source.
bool verify_prefix(const std::string& path, const PackLayerEntry& e, int64_t row_bytes, Xxh64& state,
                   const EngramRowSource& src, int64_t layer) {
  const uint64_t bytes = static_cast<uint64_t>(e.rows_done) * static_cast<uint64_t>(row_bytes);
  if (!fs::exists(path) || fs::file_size(path) < bytes) {
    spdlog::warn("pack-engram: {} is shorter than its {} committed rows: packing layer {} again", path, e.rows_done,
                 e.layer_id);
    return false;
  }
  state = hash_file_prefix(path, bytes);
  if (state.digest() != e.xxh64) {
    spdlog::warn("pack-engram: {}: committed rows fail their checksum: packing layer {} again", path, e.layer_id);
    return false;
  }
  auto f = PositionedFile::open(path, false);
  std::mt19937_64 rng(static_cast<uint64_t>(e.rows_done) * 2654435761u + static_cast<uint64_t>(e.layer_id));
  std::vector<uint8_t> a(static_cast<size_t>(row_bytes)), b(static_cast<size_t>(row_bytes));
  for (int i = 0; i < 16 && e.rows_done > 0; ++i) {
    const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(e.rows_done));
    const int64_t row = e.share.row_begin + k;
    f->read(static_cast<uint64_t>(k) * static_cast<uint64_t>(row_bytes), a.size(), a.data());
    src.read_rows(layer, std::span<const int64_t>(&row, 1), b.data());
    if (a != b) {
      spdlog::warn("pack-engram: {}: row {} differs from the source: packing layer {} again", path, row, e.layer_id);
      return false;
    }
  }
  return true;
}

}  // namespace

PackResult pack_engram(const EngramGeometry& g, const PackOptions& o) {
  DSV_CHECK(g.n_layers() > 0, "pack-engram: the config has no Engram layers");
  DSV_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "pack-engram: --rank {} is outside --world-size {}",
            o.rank, o.world_size);
  DSV_CHECK(o.chunk_rows > 0, "pack-engram: chunk_rows must be positive");
  const auto locs = locate_engram_tables(o.engram_dir, g);
  // Row comparisons during resume and the sequential copy below both read the original shards.
  const auto src = open_safetensors_dir_source(o.engram_dir, g, {.direct_io = false, .verify_checksums = false});
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (!fs::is_directory(o.out_dir)) fail("pack-engram: cannot create output folder {}: {}", o.out_dir, ec.message());

  PackResult res;
  res.index_path = (fs::path(o.out_dir) / pack_index_name(o.rank, o.world_size)).string();
  PackIndex idx;
  idx.rank = o.rank;
  idx.world = o.world_size;
  idx.geometry = g.fingerprint();
  idx.row_bytes = g.row_bytes;
  for (int64_t l = 0; l < g.n_layers(); ++l) {
    PackLayerEntry e;
    e.layer_id = g.layer_ids[static_cast<size_t>(l)];
    e.share = engram_share(g, l, o.rank, o.world_size);
    e.file = pack_rows_name(e.layer_id, o.rank, o.world_size);
    e.xxh64 = Xxh64().digest();
    idx.layers.push_back(e);
    res.rows_total += e.share.n_rows();
    res.files.push_back((fs::path(o.out_dir) / e.file).string());
  }
  std::vector<Xxh64> states(static_cast<size_t>(g.n_layers()));
  if (fs::exists(res.index_path)) {
    const PackIndex old = read_pack_index(res.index_path);
    if (old.geometry != idx.geometry || old.row_bytes != idx.row_bytes || old.layers.size() != idx.layers.size())
      fail("pack-engram: {} was packed for another Engram geometry ('{}', this config: '{}'); remove it or use another --out",
           res.index_path, old.geometry, idx.geometry);
    for (size_t l = 0; l < idx.layers.size(); ++l) {
      const PackLayerEntry& oe = old.layers[l];
      PackLayerEntry& ne = idx.layers[l];
      if (oe.layer_id != ne.layer_id || oe.share.row_begin != ne.share.row_begin || oe.share.row_end != ne.share.row_end ||
          oe.file != ne.file)
        fail("pack-engram: {} describes a different share (layer {}, rows [{}, {})); remove it or use another --out",
             res.index_path, oe.layer_id, oe.share.row_begin, oe.share.row_end);
      if (oe.rows_done > 0 && verify_prefix(res.files[l], oe, g.row_bytes, states[l], *src, static_cast<int64_t>(l))) {
        ne.rows_done = oe.rows_done;
        ne.xxh64 = oe.xxh64;
        res.rows_resumed += oe.rows_done;
      } else {
        states[l] = Xxh64();
      }
    }
    if (res.rows_resumed > 0)
      spdlog::info("pack-engram: resuming: {} of {} rows already packed and verified", res.rows_resumed, res.rows_total);
  }

  Progress bar(o.progress, res.rows_total, g.row_bytes);
  int64_t done_all = res.rows_resumed;
  const uint64_t hd = static_cast<uint64_t>(g.head_dim), sb = static_cast<uint64_t>(g.scale_bytes),
                 rb = static_cast<uint64_t>(g.row_bytes);
  bool stopped = false;
  for (size_t l = 0; l < idx.layers.size() && !stopped; ++l) {
    PackLayerEntry& e = idx.layers[l];
    const std::string& path = res.files[l];
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    // Drop anything written after the last commit (or everything, when starting over).
    if (::ftruncate(fd, static_cast<off_t>(static_cast<uint64_t>(e.rows_done) * rb)) != 0)
      fail("{}: cannot truncate: {}", path, std::strerror(errno));
    auto wf = PositionedFile::open(locs[l].weight_file, false);
    auto sf = PositionedFile::open(locs[l].scale_file, false);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    std::vector<uint8_t> w, s, rows;
    uint64_t since_commit = 0;
    auto commit = [&] {
      if (::fdatasync(fd) != 0) fail("{}: fdatasync failed: {}", path, std::strerror(errno));
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // written rows need not stay in the page cache
      e.xxh64 = states[l].digest();
      write_pack_index(res.index_path, idx);
      since_commit = 0;
    };
    while (e.rows_done < e.share.n_rows()) {
      int64_t n = std::min<int64_t>(o.chunk_rows, e.share.n_rows() - e.rows_done);
      if (o.max_rows >= 0) n = std::min<int64_t>(n, o.max_rows - res.rows_written);
      if (n <= 0) {
        stopped = true;
        break;
      }
      const uint64_t r0 = static_cast<uint64_t>(e.share.row_begin + e.rows_done);
      w.resize(static_cast<size_t>(n) * hd);
      s.resize(static_cast<size_t>(n) * sb);
      rows.resize(static_cast<size_t>(n) * rb);
      wf->read(locs[l].weight_offset + r0 * hd, w.size(), w.data());
      sf->read(locs[l].scale_offset + r0 * sb, s.size(), s.data());
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&rows[i * rb], &w[i * hd], hd);
        std::memcpy(&rows[i * rb + hd], &s[i * sb], sb);
      }
      write_all(fd, path, rows.data(), rows.size(), static_cast<uint64_t>(e.rows_done) * rb);
      states[l].update(rows.data(), rows.size());
      e.rows_done += n;
      res.rows_written += n;
      done_all += n;
      since_commit += rows.size();
      if (since_commit >= o.commit_bytes) commit();
      bar.update(done_all, res.rows_written, e.layer_id);
    }
    commit();
  }
  idx.complete = true;
  for (const auto& e : idx.layers) idx.complete = idx.complete && e.rows_done == e.share.n_rows();
  write_pack_index(res.index_path, idx);
  bar.update(done_all, res.rows_written, idx.layers.back().layer_id, true);
  bar.finish();
  res.rows_done = done_all;
  res.complete = idx.complete;
  return res;
}

}  // namespace dsv41::engram
