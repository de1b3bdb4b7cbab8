// The per-layer extrapolation of `dsv41-serve bench`: the full model's layers timed by kind from a
// smaller model of the same family whose layers were timed one by one (CudaModel::layer_times_ms).
// Layers differ by what they compute beyond the common block (their compressor ratio, whether
// they write KV or index keys for later layers, an Engram branch), so scaling the loaded model's
// average layer counts, say, its one Engram layer in every third layer of the full model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41::bench {

struct LayerKind {
  int64_t ratio = 0;
  bool kv_source = false, index_source = false, engram = false;
  bool operator==(const LayerKind&) const = default;
};
LayerKind layer_kind(const ModelConfig& c, int64_t layer);
std::string describe(const LayerKind& k);  // e.g. "ratio 2, KV + index source, Engram"

// The full model's layers of one kind and the time that stands for each.
struct KindEstimate {
  LayerKind kind;
  int64_t count = 0;
  std::vector<int64_t> measured;  // loaded-model layers whose mean time is used (the base kind's)
  bool exact = false;             // those layers are of this very kind
  bool plus_engram = false;       // the Engram branch's time added (an Engram kind without an exact match)
  double ms = 0;                  // per layer
};

struct LayerExtrapolation {
  double total_ms = 0;  // every layer of the full model
  // The Engram branch alone: an Engram layer's time minus that of a measured layer of its kind
  // without Engram (mean over such pairs); engram_measured false when the loaded model has none.
  double engram_ms = 0;
  bool engram_measured = false;
  std::vector<KindEstimate> kinds;  // in the order of each kind's first layer in the full model
};

// measured_ms[i]: the loaded model's layer i. A full-model layer takes the mean of the measured
// layers of its kind; without one, of its kind without Engram (plus the Engram branch when it has
// one), else of the same ratio, else of the same class (ratio 0 / compressed), else of all.
LayerExtrapolation extrapolate_layers(const ModelConfig& loaded, const std::vector<double>& measured_ms,
                                      const ModelConfig& full);

}  // namespace dsv41::bench
