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

class Checkpoint {
 public:
  // Opens every shard; throws dsv41::Error naming the folder/file/tensor on any defect
  // (missing shard, tensor listed in the index but absent, duplicate tensor across shards).
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

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
};

}  // namespace dsv41
