// What values `mkmodel` puts in each tensor of a random checkpoint. The aim is a model whose
// activations stay finite and O(1) through every layer, in either storage format:
//  - every linear has an effective weight of std 1/sqrt(in_features):
//      FP8 dense: e4m3 codes ~ N(0, 96) (well inside +-448) times E8M0 32x32 block scales 2^e,
//        e = round(log2(1/(96 sqrt(in)))) + {-1, 0, +1} (per-block jitter, so that a loader that
//        indexes blocks wrongly gives visibly wrong results);
//      FP4 experts: uniform e2m1 nibbles (std 2.93) times per-32 E8M0 scales
//        e = round(log2(1/(2.93 sqrt(in)))) + {-1, 0, +1};
//      EXL3: random trellis (codebook values have std ~1, or 1.244 for 3INST/MCG),
//        suh = +-1/(cb_std sqrt(k)), svh = +-U(0.8, 1.2) (W = diag(suh) H W_hat H diag(svh));
//      plain float linears (routers, compressor, indexer, heads): N(0, 1/sqrt(in));
//  - linear biases 0, router score-correction bias (gate.bias, gate.bias_vl) 0;
//  - every norm weight N(1, 0.05);
//  - mHC: hc_*_fn N(0, 1/sqrt(hc*dim)), hc_*_base N(0, 0.1), hc_*_scale N(0, 0.1);
//  - attn_sink N(0, 0.5); embeddings (token, Markov, image tokens) N(0, 0.1);
//  - Engram tables: e4m3 codes N(0, 96) with scale 2^-8 (entries std ~0.37); q/k_weight N(0, 1/sqrt(dim)).
#pragma once
#include <string>
#include <unordered_map>

#include "dsv41/loader/manifest.h"
#include "mkmodel/random_fill.h"

namespace dsv41::mkmodel {

// Indexes a manifest by name so that a `.scale` can find its `.weight`.
using SpecIndex = std::unordered_map<std::string, const TensorSpec*>;

// The fill rule of one tensor of the manifest. Throws dsv41::Error for a tensor it cannot fill.
FillRule rule_for(const TensorSpec& t, const SpecIndex& index, const ModelConfig& cfg);

}  // namespace dsv41::mkmodel
