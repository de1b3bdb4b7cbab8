// On-disk format of packed Engram rows (docs/ENGRAM.md "Packed files").
//
// DIR/engram-pack-rank{R}-of-{N}.json            index of rank R's pack (written atomically)
// DIR/engram-layer{L}-rank{R}-of-{N}.rows         rows [row_begin, row_end) of Engram layer L,
//                                                 each head_dim e4m3 bytes then scale_bytes e8m0
// A layer entry's `xxh64` is the XXH64 of the first `rows_done` rows of its file: while packing it
// is the resume point's checksum, once rows_done = row_end - row_begin it is the file checksum.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/engram/geometry.h"
#include "dsv41/engram/xxhash64.h"

namespace dsv41::engram {

inline constexpr const char* kPackFormat = "dsv41-engram-pack";
inline constexpr int kPackVersion = 1;

struct PackLayerEntry {
  int64_t layer_id = 0;
  EngramShare share;
  std::string file;  // name inside the pack folder
  int64_t rows_done = 0;
  uint64_t xxh64 = 0;
};

struct PackIndex {
  int rank = 0, world = 1;
  std::string geometry;  // EngramGeometry::fingerprint()
  int64_t row_bytes = 0;
  bool complete = false;
  std::vector<PackLayerEntry> layers;
};

std::string pack_index_name(int rank, int world);
std::string pack_rows_name(int64_t layer_id, int rank, int world);
// Throws dsv41::Error naming the file for unreadable or malformed JSON.
PackIndex read_pack_index(const std::string& path);
// Writes PATH.tmp, fsyncs it and renames it over PATH.
void write_pack_index(const std::string& path, const PackIndex& idx);
// XXH64 state after the first `nbytes` of a file (large sequential reads, page cache dropped
// behind). Throws dsv41::Error when the file is shorter.
Xxh64 hash_file_prefix(const std::string& path, uint64_t nbytes);

}  // namespace dsv41::engram
