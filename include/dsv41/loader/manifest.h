// The expected tensor list of a checkpoint, derived from config.json alone (MODEL.md §3.2 for the
// released FP8/FP4 format, EXL3.md §1.3/§1.8 for the EXL3 format), and a checker that compares a
// real checkpoint against it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsv41/common/dtype.h"
#include "dsv41/config/model_config.h"

namespace dsv41 {

class Checkpoint;

enum class CheckpointFormat { kFp8, kExl3 };

// Which part of the model a tensor belongs to (inspect's byte breakdown).
enum class Component { kAttention, kRoutedExperts, kSharedExperts, kEngram, kDSpark, kHead, kEmbedding, kOther };

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Component component;
  // EXL3 linears: the trellis' last dim is 16*K and K is free per tensor (1..8); the checker
  // accepts any K there. `exl3_linear` names the linear's prefix (e.g. "layers.0.attn.wq_a").
  bool exl3_trellis = false;
  std::string exl3_linear;
};

// For the EXL3 format, the bit width to put in the manifest's trellis shapes (the checker ignores
// it; mkmodel uses it). `bits_for(prefix)` may return different K per linear.
struct Exl3Plan {
  int default_bits = 3;
  int head_bits = 6;
  std::map<std::string, int> per_linear;  // prefix -> K
  int bits_for(const std::string& prefix) const;
};

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, CheckpointFormat fmt,
                                         const Exl3Plan& plan = {});

// Compares a checkpoint to the manifest: missing, unexpected, mis-shaped, mis-typed tensors, and
// invalid EXL3 markers. Returns one line per problem (empty when the checkpoint is complete).
std::vector<std::string> check_checkpoint(const ModelConfig& cfg, CheckpointFormat fmt, const Checkpoint& ckpt);

// The format a config declares (quantization_config.quant_method).
CheckpointFormat checkpoint_format(const ModelConfig& cfg);

const char* component_name(Component c);

}  // namespace dsv41
