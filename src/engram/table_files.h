// Locating the Engram tables inside safetensors shards without mapping them: the index (or,
// without one, every *.safetensors header in the folder) names the shard of each table, and the
// shard's JSON header gives the byte offset of row 0. Shared by the --engram-dir reader and the
// packer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/engram/geometry.h"

namespace dsv41::engram {

struct TableLocation {
  std::string weight_file, scale_file;     // full paths
  uint64_t weight_offset = 0, scale_offset = 0;  // absolute file offsets of row 0
};

std::string engram_weight_name(int64_t layer_id);  // layers.{L}.engram.embed.weight
std::string engram_scale_name(int64_t layer_id);   // layers.{L}.engram.embed.scale

// One entry per Engram layer. Throws one dsv41::Error for a missing index entry or shard, a
// tensor with the wrong dtype/shape for the config, or a shard shorter than its header says.
std::vector<TableLocation> locate_engram_tables(const std::string& dir, const EngramGeometry& g);

}  // namespace dsv41::engram
