// Where Engram table rows come from. The engine asks for (Engram layer, row ids) and gets the
// raw rows: `head_dim` F8_E4M3 bytes then `scale_bytes` F8_E8M0 bytes each (EngramGeometry).
//
// Three sources:
//  - open_checkpoint_source: the tables inside an opened (memory-mapped) Checkpoint, what the
//    engine did before the tables moved to disk; for small models and tests.
//  - open_safetensors_dir_source (`--engram-dir DIR`): the original checkpoint's
//    model.safetensors.index.json plus only the shards holding layers.{L}.engram.embed.weight and
//    .scale; each row is read with positioned reads at its safetensors data offset (two reads:
//    weight bytes and scale bytes), O_DIRECT through an aligned bounce buffer where the file
//    system allows it. Tables are never mapped.
//  - open_packed_source (`--engram-packed DIR`): files written by `dsv41-serve pack-engram`,
//    one per (rank, Engram layer), rows interleaved (one read per row), checksummed.
// Every source validates at open (missing shard or file, wrong table shape for the config,
// truncated file, checksum mismatch) and throws one dsv41::Error naming the file. read_rows
// throws dsv41::Error for a failed or short read of that request only.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dsv41/engram/geometry.h"

namespace dsv41 {
class Checkpoint;
}

namespace dsv41::engram {

class EngramRowSource {
 public:
  virtual ~EngramRowSource() = default;
  virtual const EngramGeometry& geometry() const = 0;
  // True when `row` of Engram layer `layer` can be served (a one-rank pack holds only its share).
  virtual bool covers(int64_t layer, int64_t row) const = 0;
  // Copies row ids[i] of Engram layer `layer` (position in engram_layer_ids) to
  // out + i·row_bytes. Thread-safe; blocking. Throws dsv41::Error for an uncovered row or an
  // I/O failure.
  virtual void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) const = 0;
  virtual std::string describe() const = 0;
  // Concurrent reads beyond which this source gets no faster; 0: no such limit (reads that wait on
  // storage, where the store's io_threads is the queue depth). EngramStore runs the smaller of the
  // two.
  virtual int max_useful_readers() const { return 0; }
};

struct EngramIoOptions {
  // Use O_DIRECT reads (aligned bounce buffer) when the file system supports them; buffered
  // pread otherwise. Buffered reads go through the page cache (good for a small hot set,
  // double caching for a large one).
  bool direct_io = true;
  // Packed files: hash every file at open and compare with the index (a full read of the files).
  bool verify_checksums = true;
};

// `ckpt` must outlive the source.
std::unique_ptr<EngramRowSource> open_checkpoint_source(const Checkpoint& ckpt, const EngramGeometry& g);
std::unique_ptr<EngramRowSource> open_safetensors_dir_source(const std::string& dir, const EngramGeometry& g,
                                                             const EngramIoOptions& io = {});
// The pack of `rank` in `world` (its share only). world = 0: every rank's pack found in DIR
// together (they must all be there and agree on the world size): the whole table.
std::unique_ptr<EngramRowSource> open_packed_source(const std::string& dir, const EngramGeometry& g, int rank,
                                                    int world, const EngramIoOptions& io = {});

// MODEL.md §5.3: value d of a row = bf16( e4m3(row[d]) · 2^(row[head_dim + d/32] − 127) ).
// Writes head_dim floats (each exactly a BF16 value).
void dequant_row(const uint8_t* row, int64_t head_dim, float* out);

}  // namespace dsv41::engram
