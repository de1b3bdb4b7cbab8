// `dsv41-serve pack-engram`: copies the Engram rows one tensor-parallel rank owns
// (engram_share) out of the original safetensors shards into local, checksummed files that the
// server reads with --engram-packed (format: docs/ENGRAM.md "Packed files").
//
// Resumable: progress is committed (data fdatasync'ed, then the index rewritten atomically)
// every commit_bytes; a new run re-hashes the committed prefix of each file, compares it with
// the index, spot-checks rows against the source, truncates whatever was written after the last
// commit and continues. A prefix that fails verification is packed again from its start.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/engram/geometry.h"

namespace dsv41::engram {

struct PackOptions {
  std::string engram_dir;  // original index + shards
  std::string out_dir;
  int rank = 0, world_size = 1;
  int64_t max_rows = -1;          // stop after packing this many rows in this run (-1: all)
  int64_t chunk_rows = 1 << 16;   // rows per sequential read/write
  uint64_t commit_bytes = 256ull << 20;
  bool progress = true;           // progress bar on stderr
};

struct PackResult {
  bool complete = false;
  int64_t rows_total = 0;    // rows of this rank's share, all layers
  int64_t rows_done = 0;     // rows packed so far (all runs)
  int64_t rows_written = 0;  // rows written by this run
  int64_t rows_resumed = 0;  // rows found packed and verified at start
  std::string index_path;
  std::vector<std::string> files;
};

PackResult pack_engram(const EngramGeometry& g, const PackOptions& o);

}  // namespace dsv41::engram
