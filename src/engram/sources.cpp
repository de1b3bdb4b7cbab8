// The three EngramRowSource implementations (row_source.h) and the row dequantisation.
#include <algorithm>
#include <filesystem>
#include <future>
#include <map>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/engram/row_source.h"
#include "dsv41/loader/checkpoint.h"
#include "engram/pack_format.h"
#include "engram/positioned_file.h"
#include "engram/table_files.h"

namespace dsv41::engram {

namespace fs = std::filesystem;

void dequant_row(const uint8_t* row, int64_t head_dim, float* out) {
  const uint8_t* scale = row + head_dim;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = bf16_round(e4m3_to_f32(row[d]) * e8m0_to_f32(scale[d / 32]));
}

namespace {

void check_layer(const EngramGeometry& g, int64_t layer) {
  if (layer < 0 || layer >= g.n_layers()) fail("engram: layer index {} out of range ({} Engram layers)", layer, g.n_layers());
}

void check_row(const EngramGeometry& g, int64_t layer, int64_t row) {
  if (row < 0 || row >= g.rows[static_cast<size_t>(layer)])
    fail("engram: row {} out of range for Engram layer {} ({} rows)", row, g.layer_ids[static_cast<size_t>(layer)],
         g.rows[static_cast<size_t>(layer)]);
}

// ---- (a) tables inside a memory-mapped checkpoint ----
class CheckpointSource final : public EngramRowSource {
 public:
  CheckpointSource(const Checkpoint& ck, const EngramGeometry& g) : g_(g) {
    for (int64_t l = 0; l < g.n_layers(); ++l) {
      const int64_t id = g.layer_ids[static_cast<size_t>(l)], rows = g.rows[static_cast<size_t>(l)];
      const TensorInfo& w = ck.get(engram_weight_name(id));
      const TensorInfo& s = ck.get(engram_scale_name(id));
      DSV_CHECK(w.dtype == DType::F8_E4M3 && w.shape == std::vector<int64_t>({rows, g.head_dim}),
                "tensor {}: expected F8_E4M3 [{}, {}], got {} {}", w.name, rows, g.head_dim, dtype_name(w.dtype),
                w.shape_str());
      DSV_CHECK(s.dtype == DType::F8_E8M0 && s.shape == std::vector<int64_t>({rows, g.scale_bytes}),
                "tensor {}: expected F8_E8M0 [{}, {}], got {} {}", s.name, rows, g.scale_bytes, dtype_name(s.dtype),
                s.shape_str());
      DSV_CHECK(w.data != nullptr && s.data != nullptr, "tensor {}: no data mapped", w.name);
      weight_.push_back(w.data);
      scale_.push_back(s.data);
    }
  }
  const EngramGeometry& geometry() const override { return g_; }
  bool covers(int64_t layer, int64_t row) const override {
    return layer >= 0 && layer < g_.n_layers() && row >= 0 && row < g_.rows[static_cast<size_t>(layer)];
  }
  void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) const override {
    check_layer(g_, layer);
    const uint8_t* w = weight_[static_cast<size_t>(layer)];
    const uint8_t* s = scale_[static_cast<size_t>(layer)];
    for (size_t i = 0; i < ids.size(); ++i) {
      check_row(g_, layer, ids[i]);
      uint8_t* o = out + i * static_cast<size_t>(g_.row_bytes);
      std::copy_n(w + ids[i] * g_.head_dim, g_.head_dim, o);
      std::copy_n(s + ids[i] * g_.scale_bytes, g_.scale_bytes, o + g_.head_dim);
    }
  }
  std::string describe() const override { return "checkpoint (memory-mapped)"; }
  // A read is a copy out of the page cache (a minor fault per page touched the first time): CPU
  // work, not a queue of device reads, so a few threads do it as fast as 64, and 64 sleeping
  // threads woken in a chain on a 16-core host cost more than they bring. Measured on the H200's
  // host (3-layer model, 24 rows a token; bench/RESULTS.md): batch-4 decode steps 2.83-2.90 ms with
  // 64 readers, 2.72-2.76 with 16, 2.67-2.76 with 8, 2.63-2.77 with 4; 8k-token prefill
  // 29.8-30.7k tokens/s with 64 and with 8, 29.3-29.8k with 4.
  int max_useful_readers() const override { return kMappedReaders; }
  static constexpr int kMappedReaders = 8;

 private:
  EngramGeometry g_;
  std::vector<const uint8_t*> weight_, scale_;
};

// ---- (b) positioned reads from the original safetensors shards ----
class SafetensorsDirSource final : public EngramRowSource {
 public:
  SafetensorsDirSource(const std::string& dir, const EngramGeometry& g, const EngramIoOptions& io) : g_(g), dir_(dir) {
    const auto locs = locate_engram_tables(dir, g);
    std::map<std::string, const PositionedFile*> by_path;
    auto file_of = [&](const std::string& p) {
      auto it = by_path.find(p);
      if (it != by_path.end()) return it->second;
      files_.push_back(PositionedFile::open(p, io.direct_io));
      return by_path.emplace(p, files_.back().get()).first->second;
    };
    for (const auto& l : locs) {
      tables_.push_back({file_of(l.weight_file), file_of(l.scale_file), l.weight_offset, l.scale_offset});
    }
  }
  const EngramGeometry& geometry() const override { return g_; }
  bool covers(int64_t layer, int64_t row) const override {
    return layer >= 0 && layer < g_.n_layers() && row >= 0 && row < g_.rows[static_cast<size_t>(layer)];
  }
  void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) const override {
    check_layer(g_, layer);
    const Table& t = tables_[static_cast<size_t>(layer)];
    const uint64_t hd = static_cast<uint64_t>(g_.head_dim), sb = static_cast<uint64_t>(g_.scale_bytes);
    for (size_t i = 0; i < ids.size(); ++i) {
      check_row(g_, layer, ids[i]);
      uint8_t* o = out + i * static_cast<size_t>(g_.row_bytes);
      const uint64_t r = static_cast<uint64_t>(ids[i]);
      t.weight->read(t.weight_offset + r * hd, hd, o);
      t.scale->read(t.scale_offset + r * sb, sb, o + hd);
    }
  }
  std::string describe() const override {
    return fmt::format("safetensors shards in {} ({} I/O)", dir_,
                       !files_.empty() && files_.front()->direct() ? "O_DIRECT" : "buffered");
  }

 private:
  struct Table {
    const PositionedFile* weight;
    const PositionedFile* scale;
    uint64_t weight_offset, scale_offset;
  };
  EngramGeometry g_;
  std::string dir_;
  std::vector<std::unique_ptr<PositionedFile>> files_;
  std::vector<Table> tables_;
};

// ---- (c) packed per-rank files ----
class PackedSource final : public EngramRowSource {
 public:
  PackedSource(const std::string& dir, const EngramGeometry& g, int rank, int world, const EngramIoOptions& io)
      : g_(g), dir_(dir) {
    if (!fs::is_directory(dir)) fail("engram pack {}: not a directory", dir);
    std::vector<int> ranks;
    if (world == 0) {
      world = find_world(dir);
      for (int r = 0; r < world; ++r) ranks.push_back(r);
    } else {
      DSV_CHECK(world >= 1 && rank >= 0 && rank < world, "engram pack: rank {} is outside world size {}", rank, world);
      ranks.push_back(rank);
    }
    world_ = world;
    segments_.resize(static_cast<size_t>(g.n_layers()));
    struct Pending {
      std::string path;
      uint64_t bytes;
      uint64_t xxh64;
    };
    std::vector<Pending> to_verify;
    for (int r : ranks) {
      const std::string ipath = (fs::path(dir) / pack_index_name(r, world)).string();
      if (!fs::exists(ipath))
        fail("engram pack {}: no {} (run `dsv41-serve pack-engram --rank {} --world-size {}` first)", dir,
             pack_index_name(r, world), r, world);
      const PackIndex idx = read_pack_index(ipath);
      if (idx.rank != r || idx.world != world)
        fail("{}: says rank {} of {}, its name says rank {} of {}", ipath, idx.rank, idx.world, r, world);
      if (idx.geometry != g.fingerprint())
        fail("{}: packed for Engram geometry '{}' but the config has '{}'", ipath, idx.geometry, g.fingerprint());
      if (idx.row_bytes != g.row_bytes) fail("{}: row_bytes {} but the config needs {}", ipath, idx.row_bytes, g.row_bytes);
      if (!idx.complete)
        fail("{}: the pack is incomplete: run `dsv41-serve pack-engram` again to resume it", ipath);
      if (static_cast<int64_t>(idx.layers.size()) != g.n_layers())
        fail("{}: {} layers packed but the config has {} Engram layers", ipath, idx.layers.size(), g.n_layers());
      for (int64_t l = 0; l < g.n_layers(); ++l) {
        const PackLayerEntry& e = idx.layers[static_cast<size_t>(l)];
        const EngramShare want = engram_share(g, l, r, world);
        if (e.layer_id != g.layer_ids[static_cast<size_t>(l)] || e.share.row_begin != want.row_begin ||
            e.share.row_end != want.row_end || e.share.col_begin != want.col_begin || e.share.col_end != want.col_end)
          fail("{}: layer entry {} (layer {}, rows [{}, {})) does not match this rank's share (layer {}, rows [{}, {}))",
               ipath, l, e.layer_id, e.share.row_begin, e.share.row_end, g.layer_ids[static_cast<size_t>(l)],
               want.row_begin, want.row_end);
        if (e.rows_done != want.n_rows()) fail("{}: layer {} is incomplete", ipath, e.layer_id);
        const std::string path = (fs::path(dir) / e.file).string();
        if (!fs::exists(path)) fail("engram pack {}: file {} is missing", dir, e.file);
        const uint64_t bytes = static_cast<uint64_t>(want.n_rows()) * static_cast<uint64_t>(g.row_bytes);
        const uint64_t size = fs::file_size(path);
        if (size != bytes)
          fail("{}: {} bytes, expected {} ({} rows of {} bytes){}", path, size, bytes, want.n_rows(), g.row_bytes,
               size < bytes ? " (truncated)" : "");
        if (want.n_rows() == 0) continue;
        segments_[static_cast<size_t>(l)].push_back({want, PositionedFile::open(path, io.direct_io)});
        if (io.verify_checksums) to_verify.push_back({path, bytes, e.xxh64});
      }
    }
    // One thread per file: a full read of every file, as fast as the disks allow.
    std::vector<std::future<void>> checks;
    for (const auto& p : to_verify)
      checks.push_back(std::async(std::launch::async, [p] {
        const uint64_t got = hash_file_prefix(p.path, p.bytes).digest();
        if (got != p.xxh64)
          fail("{}: checksum mismatch: xxh64 {} but the index says {} (corrupted file: pack it again)", p.path,
               hex64(got), hex64(p.xxh64));
      }));
    for (auto& c : checks) c.get();  // rethrows the first mismatch
  }

  const EngramGeometry& geometry() const override { return g_; }
  bool covers(int64_t layer, int64_t row) const override { return find(layer, row) != nullptr; }
  void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) const override {
    check_layer(g_, layer);
    const uint64_t rb = static_cast<uint64_t>(g_.row_bytes);
    for (size_t i = 0; i < ids.size(); ++i) {
      check_row(g_, layer, ids[i]);
      const Segment* s = find(layer, ids[i]);
      if (!s)
        fail("engram pack {}: row {} of Engram layer {} belongs to rank {} of {}, not to this pack", dir_, ids[i],
             g_.layer_ids[static_cast<size_t>(layer)], engram_row_owner(g_, layer, ids[i], world_), world_);
      s->file->read(static_cast<uint64_t>(ids[i] - s->share.row_begin) * rb, rb, out + i * rb);
    }
  }
  std::string describe() const override {
    bool direct = false;
    for (const auto& l : segments_)
      for (const auto& s : l) direct = direct || s.file->direct();
    return fmt::format("packed rows in {} (world size {}, {} I/O)", dir_, world_, direct ? "O_DIRECT" : "buffered");
  }

 private:
  struct Segment {
    EngramShare share;
    std::unique_ptr<PositionedFile> file;
  };
  const Segment* find(int64_t layer, int64_t row) const {
    if (layer < 0 || layer >= g_.n_layers()) return nullptr;
    for (const auto& s : segments_[static_cast<size_t>(layer)])
      if (s.share.contains(row)) return &s;
    return nullptr;
  }
  // The world size of the packs in DIR (all index files must agree).
  static int find_world(const std::string& dir) {
    int world = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      int r = 0, w = 0;
      if (std::sscanf(n.c_str(), "engram-pack-rank%d-of-%d.json", &r, &w) != 2 || n != pack_index_name(r, w)) continue;
      if (world != 0 && w != world) fail("engram pack {}: holds packs for world sizes {} and {}", dir, world, w);
      world = w;
    }
    if (world == 0) fail("engram pack {}: no engram-pack-rank*-of-*.json index (run `dsv41-serve pack-engram`)", dir);
    return world;
  }

  EngramGeometry g_;
  std::string dir_;
  int world_ = 1;
  std::vector<std::vector<Segment>> segments_;  // [layer] -> segments of the ranks held
};

}  // namespace

std::unique_ptr<EngramRowSource> open_checkpoint_source(const Checkpoint& ckpt, const EngramGeometry& g) {
  return std::make_unique<CheckpointSource>(ckpt, g);
}

std::unique_ptr<EngramRowSource> open_safetensors_dir_source(const std::string& dir, const EngramGeometry& g,
                                                             const EngramIoOptions& io) {
  return std::make_unique<SafetensorsDirSource>(dir, g, io);
}

std::unique_ptr<EngramRowSource> open_packed_source(const std::string& dir, const EngramGeometry& g, int rank, int world,
                                                    const EngramIoOptions& io) {
  return std::make_unique<PackedSource>(dir, g, rank, world, io);
}

}  // namespace dsv41::engram
