// The CUDA model backend: the FP8/FP4/BF16 release checkpoint's text forward pass on one GPU,
// composed from the validated ops of include/dsv41/ops/gpu_ops.h in exactly the CPU reference
// engine's order (src/model/*.cpp is the truth; every numeric choice there is mirrored here).
//
//  - Weights are uploaded once at load; routed experts become one FP4 bank per layer.
//  - A sequence's state lives on the GPU (bf16 window rings, compressed KV and index keys per KV
//    source, fp32 compressor carries), sized once for `max_context` tokens; the Engram n-gram
//    history stays on the host and the Engram table rows come from the host EngramStore.
//  - One scratch arena is allocated at load for `max_chunk_tokens` tokens: a forward allocates no
//    device memory. Longer chunks run as several passes that keep the chunk's index-list layout,
//    so results do not depend on the pass size.
//  - Chunking follows CpuModel: a one-token step at or beyond SeqState::prompt_len is a decode step
//    (ring-order window list, the decode-time index-key alias unless corrected_index_keys).
//  - The indexer's candidate-block and top-k selections run on the host over the device's scores
//    (one download per index layer and pass): the CPU engine's tie order among exactly equal
//    scores (torch_topk_indices) decides which entries are attended.
// Not covered yet: EXL3 checkpoints, DSpark drafting, tensor parallelism, pooled sequence state
// (the server's state pool), CUDA graphs / batched decode.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv41/engram/open.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/model.h"

namespace dsv41::model {

struct CudaModelOptions {
  // Engram (as CpuModelOptions): the token map file and where table rows come from.
  std::string engram_token_map;
  engram::EngramStorageOptions engram_storage;
  std::shared_ptr<engram::EngramStore> engram_store;
  bool corrected_index_keys = false;  // see CpuModelOptions
  int64_t mix_gemm_k_parts = 0;       // see CpuModelOptions (prefill mixes GEMM K partition, 0..32)
  int device = 0;                     // CUDA device ordinal
  // Context tokens a sequence state holds; 0 = min(max_position_embeddings, 32768).
  int64_t max_context = 0;
  // Tokens per forward pass (sizes the scratch arena).
  int64_t max_chunk_tokens = 256;
};

// Device memory the model holds, in bytes (printed at load).
struct CudaMemoryBreakdown {
  int64_t weights = 0;
  int64_t state_per_sequence = 0;  // one sequence state of max_context tokens
  int64_t scratch = 0;
};

class CudaModel final : public Model {
 public:
  // Throws dsv41::Error for a checkpoint this backend cannot run (names the tensor/format) and
  // when the build has no CUDA.
  static std::unique_ptr<CudaModel> load(const std::string& dir, const CudaModelOptions& opts);
  ~CudaModel() override;

  const ModelConfig& config() const override;
  std::unique_ptr<SeqState> new_sequence() const override;
  void forward(std::span<ForwardItem> batch) override;

  // One sequence, as CpuModel::forward_sequence (dump: streams after every block, downloaded).
  void forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                        std::vector<float>* logits, BlockDump* dump = nullptr);
  bool has_dspark() const { return false; }
  CudaMemoryBreakdown memory() const;
  int64_t max_context() const;

  struct Impl;

 private:
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41::model
