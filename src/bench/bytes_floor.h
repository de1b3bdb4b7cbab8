// The bytes floor of a decode step (`dsv41-serve bench`): the bytes a decode step must at least read
// from device memory, per layer and for the whole model, and what that means at a given copy
// bandwidth. Weights count as stored in the checkpoint (FP8 + E8M0 scales, FP4 experts, BF16/F32
// dense tensors); the sequence state counts as the engine stores it (bf16 rows, fp32 carries).
//
// Per decode step of `batch` sequences that each hold `context` tokens (MODEL.md §5.4, §5.7, §5.8):
//  - every layer's non-routed weights once (attention, shared expert, router, mHC, norms,
//    compressor/indexer weights, Engram wkv and gates; not the Engram tables, not the DSpark stages);
//  - the routed experts the batch selects: E·(1 − (1 − k/E)^batch) distinct experts expected when
//    every token picks k of E experts uniformly (the floor of a batch that shares expert reads);
//  - per sequence and layer: the window rows (min(p+1, window)), the compressed rows attended
//    (min(index_topk, visible entries)) on compressed layers, the index keys an index source
//    scores (all visible keys; a layer masked by the candidate source only those of the kept
//    candidate blocks), the ratio > 1 compressor carries, and the Engram table rows of the token;
//  - once per step: the head, plus one embedding row and the final norm per sequence.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41 {
class Checkpoint;
}

namespace dsv41::bench {

// Bytes of one backbone layer's weights.
struct LayerWeights {
  int64_t layer = 0;
  int64_t dense = 0;        // every tensor of the layer except routed experts and Engram tables
  int64_t experts = 0;      // all routed experts of the layer
  int64_t n_experts = 0;    // routed experts found (equal to the config's n_routed_experts)
  int64_t expert_each() const { return n_experts > 0 ? experts / n_experts : 0; }
};

struct ModelWeights {
  std::vector<LayerWeights> layers;  // [num_hidden_layers]
  int64_t head = 0;                  // head.weight (+ scale when quantised)
  int64_t embed = 0;                 // embed.weight: the whole table (one row per token is read)
  int64_t final_norm = 0;            // norm.weight
};

// Sizes of named tensors: the checkpoint's (what was loaded) or the manifest's (a config alone).
using TensorSizes = std::vector<std::pair<std::string, uint64_t>>;
TensorSizes checkpoint_tensor_sizes(const Checkpoint& ckpt);
// The manifest's tensor list for `cfg` in its own format (the full model of a config file).
TensorSizes manifest_tensor_sizes(const ModelConfig& cfg);

// Sorts tensors into layers (layers.L.*), head, embedding and final norm; ignores mtp.*, vision and
// Engram tables. Throws when a layer the config declares has no tensors.
ModelWeights classify_weights(const ModelConfig& cfg, const TensorSizes& tensors);

// Bytes of sequence state one decode token of layer `layer` reads, for a token at position `pos`
// (the sequence then holds pos + 1 tokens). `value_bytes` = bytes per stored KV value (2: bf16).
struct StateRead {
  int64_t window = 0, compressed = 0, index_keys = 0, carries = 0;
  int64_t total() const { return window + compressed + index_keys + carries; }
};
StateRead decode_state_read(const ModelConfig& cfg, int64_t layer, int64_t pos, int64_t value_bytes = 2);

// Bytes of Engram table rows one token reads at an Engram layer (FP8 row + E8M0 scale per 32).
int64_t engram_row_bytes_per_token(const ModelConfig& cfg);

// E·(1 − (1 − k/E)^tokens): expected distinct experts when `tokens` tokens each pick k of E.
double expected_distinct_experts(int64_t n_experts, int64_t top_k, int64_t tokens);

struct StepBytes {
  double dense = 0, experts = 0, state = 0, engram_rows = 0;  // summed over the layers
  double head = 0, embed_norm = 0;                            // outside the layers
  std::vector<double> per_layer;                              // [layer]: all of the layer's bytes
  double layers_total() const { return dense + experts + state + engram_rows; }
  double total() const { return layers_total() + head + embed_norm; }
};
// One decode step of `batch` sequences at context `context` (the new token sits at position
// `context`). `layers` limits the sum to the first N layers (0 = all of w.layers).
StepBytes decode_step_bytes(const ModelConfig& cfg, const ModelWeights& w, int64_t batch, int64_t context,
                            int64_t value_bytes = 2);

struct TpLink;
// Two-way tensor parallelism projection of the CUDA path (docs/TENSOR_PARALLEL.md, "CUDA path"): per
// node, the split parts (wq_b, wo_a, wo_b, shared expert, head rows, half of the distinct experts)
// are halved, the replicated parts (wq_a, wkv, compressors, indexers, Engram, norms, mHC, router,
// the KV state) are read in full; its all-reduce plan is the CUDA path's (4 a layer and the logits,
// fp32 rows: project_tp2).
struct TpProjection {
  double node_bytes = 0;        // bytes one node reads per step
  double memory_s = 0;          // node_bytes / node bandwidth
  double allreduce_s = 0;       // collectives per step: latency each + all their bytes over the link
  int64_t allreduces = 0;       // collectives per step
  double allreduce_bytes = 0;   // their mean payload
  int64_t layer_allreduces = 0;       // of them, the layers' (the rest: the logits)
  double layer_allreduce_bytes = 0;   // the layers' payload per step
  double head_allreduce_bytes = 0;    // the logits' payload per step
  double step_s() const { return memory_s + allreduce_s; }
  void totals(const TpLink& link);                    // allreduces, allreduce_bytes, allreduce_s
  void scale_layers(double factor, const TpLink& link);  // the layers' collectives x factor
};
struct TpLink {
  double node_bandwidth = 232e9;  // bytes/s one node's memory streams
  double link_bandwidth = 25e9;   // bytes/s one direction of the node-to-node link (200 Gb/s)
  double latency_s = 15e-6;       // per all-reduce (assumed, not measured)
};
TpProjection project_tp2(const ModelConfig& cfg, const TensorSizes& tensors, const ModelWeights& w, int64_t batch,
                         int64_t context, const TpLink& link, int64_t value_bytes = 2);

}  // namespace dsv41::bench
