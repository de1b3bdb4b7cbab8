// A checkpoint folder: config.json plus one or more safetensors shards, resolved through
// model.safetensors.index.json when present (else every *.safetensors in the folder).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsv41/loader/safetensors.h"

namespace dsv41 {

// True for the Engram table tensors `layers.{L}.engram.embed.weight` / `.scale` (the ~101 GB
// tables that may live outside the checkpoint folder).
bool is_engram_table_tensor(std::string_view name);

struct CheckpointOpenOptions {
  // Where the Engram tables are read from instead of this folder ("--engram-dir DIR",
  // "--engram-packed DIR"); empty: they must be in the folder. When set, a shard that the index
  // lists but that is absent is skipped (with a log line) if every tensor the index puts in it is
  // an Engram table; those tensors are then not part of the checkpoint.
  std::string engram_elsewhere;
};

class Checkpoint {
 public:
  // Opens every shard; throws dsv41::Error naming the folder/file/tensor on any defect
  // (missing shard, tensor listed in the index but absent, duplicate tensor across shards).
  static std::unique_ptr<Checkpoint> open(const std::string& dir);
  static std::unique_ptr<Checkpoint> open(const std::string& dir, const CheckpointOpenOptions& options);
  // Shards the index lists that were skipped (absent, Engram tables read elsewhere).
  const std::vector<std::string>& skipped_shards() const { return skipped_; }

  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/config.json"; }
  const TensorInfo* find(std::string_view name) const;
  // Like find() but throws "checkpoint DIR: missing tensor NAME".
  const TensorInfo& get(std::string_view name) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }
  // All tensors in a stable order (shard order, then file order).
  std::vector<const TensorInfo*> tensors() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const TensorInfo*> by_name_;
  std::vector<std::string> skipped_;
};

}  // namespace dsv41
