// config.json edits done by `mkmodel`: truncating the layer stack (--layers) and writing the
// quantization_config of the output format.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dsv41/loader/manifest.h"
#include "mkmodel/bits_plan.h"

namespace dsv41::mkmodel {

nlohmann::json read_config_json(const std::string& path);

// Sets num_hidden_layers = n (1 <= n <= current) and keeps every layer-indexed list consistent:
// compress_ratios keeps the first n backbone entries plus the DSpark entries; KV/index source
// lists, engram_layer_ids (with their engram_num_embeddings) drop ids >= n; a candidate source
// >= n becomes -1 (its consumers are gone too); DSpark target taps >= n move down by the number of
// removed layers (they keep their distance from the top of the stack). Throws dsv41::Error when
// the result is not a valid config (validate_config), naming the first problem.
void truncate_layers(nlohmann::json& root, int64_t n, const std::string& label);

// Sets engram_vocab_size = v and recomputes engram_num_embeddings (the column primes, MODEL.md
// §3.5), shrinking the Engram tables of a large-shape test model (the real ones are ~100 GB per
// layer). Throws dsv41::Error when the result is not a valid config.
void set_engram_vocab_size(nlohmann::json& root, int64_t v, const std::string& label);

// Replaces quantization_config for the output format. For EXL3 the source's FP8 block (if any) is
// kept as original_quantization_config (EXL3.md §1.2); for FP8 the released block is written,
// with expert_dtype taken from the source (or its original_quantization_config), default fp4.
void set_quantization_config(nlohmann::json& root, CheckpointFormat fmt, const BitsPlanResult* plan);

}  // namespace dsv41::mkmodel
