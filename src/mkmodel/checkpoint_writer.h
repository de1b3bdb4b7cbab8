// Streams a random checkpoint to disk: tensors are assigned to shards of at most `shard_bytes`
// (all tensors of one linear stay in one shard), each shard's header is written first and the data
// is generated in parallel batches of chunks and appended in order, so memory stays bounded
// (about `batch_bytes`) whatever the model size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/loader/manifest.h"

namespace dsv41::mkmodel {

struct WriteOptions {
  std::string out_dir;
  uint64_t seed = 0;
  uint64_t shard_bytes = 4000000000ull;
  uint64_t batch_bytes = 256ull << 20;
};

struct WriteStats {
  size_t tensors = 0;
  uint64_t bytes = 0;
  int shards = 0;
};

// Throws dsv41::Error when the file system holding `dir` has less than `bytes` (+ 64 MB) free.
void require_free_space(const std::string& dir, uint64_t bytes);

// Writes `specs` with the values of value_rules.h. One shard is `model.safetensors`; more are
// `model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`.
WriteStats write_random_checkpoint(const std::vector<TensorSpec>& specs, const ModelConfig& cfg,
                                   const WriteOptions& opt);

}  // namespace dsv41::mkmodel
