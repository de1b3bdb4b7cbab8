// Picks and opens the Engram row storage from the command-line options (one call for the
// server, the tools and the worker ranks): --engram-packed DIR > --engram-dir DIR > the tables
// inside the checkpoint.
#pragma once
#include <memory>
#include <string>

#include "dsv41/config/model_config.h"
#include "dsv41/engram/row_store.h"

namespace dsv41 {
class Checkpoint;
}

namespace dsv41::engram {

struct EngramStorageOptions {
  std::string engram_dir;     // --engram-dir: original index + Engram shards
  std::string engram_packed;  // --engram-packed: pack-engram output
  double cache_gib = 0.0;     // --engram-cache-gib
  int io_threads = 64;        // queue depth
  bool direct_io = true;
  bool verify_checksums = true;  // packed files: full checksum pass at start-up
  int rank = 0, world_size = 1;  // tensor-parallel position (packed: the pack to open)
};

// Returns nullptr when the config has no Engram layers. With neither directory set, `ckpt` must
// hold the tables (throws a clear error naming --engram-dir otherwise). A packed folder without
// this rank's pack but with a complete set of another world size is accepted at world size 1
// (all ranks' packs together hold the whole table).
std::shared_ptr<EngramStore> open_engram_store(const ModelConfig& cfg, const Checkpoint* ckpt,
                                               const EngramStorageOptions& o);

}  // namespace dsv41::engram
