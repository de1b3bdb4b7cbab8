// The expected tensor list of a checkpoint, derived from config.json alone (MODEL.md §3.2 for the
// released FP8/FP4 format, EXL3.md §1.3/§1.8 for the EXL3 format), and a checker that compares a
// real checkpoint against it.
//
// Coverage: the text model, the DSpark stages (`mtp.*`) and, when the config has a
// `vision_config`, the vision tower (`vision.*`, `aligner.*`, `image_{start,end,newline}`) and the
// routers' `gate.bias_vl`, which the reference creates only when vision is enabled. With vision the
// FP8 manifest of the released config is exactly the released index: 96,085 tensors,
// 510,286,023,000 bytes (MODEL.md §0). The engine itself never reads the vision tensors.
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

// Which part of the model a tensor belongs to (inspect's byte breakdown). kOther = norms, mHC
// parameters and the MoE routers; kDSpark = everything under `mtp.*`.
enum class Component { kAttention, kRoutedExperts, kSharedExperts, kEngram, kDSpark, kHead, kEmbedding, kOther, kVision };
constexpr int kNumComponents = 9;

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Component component;
  // EXL3 linears: the trellis' last dim is 16*K and K is free per tensor (1..8); the checker
  // accepts any K there. `exl3_linear` names the linear's prefix (e.g. "layers.0.attn.wq_a") on
  // every tensor of an EXL3 linear (trellis, suh, svh, marker).
  bool exl3_trellis = false;
  std::string exl3_linear;
  // May be absent: vision tensors and Engram tables of an EXL3 checkpoint (the tables are read
  // from the original checkpoint with --engram-dir), Engram tables with CheckOptions below.
  bool optional = false;
  // Other dtypes the checker accepts (EXL3 keeps unquantized tensors as F16, BF16 or F32).
  std::vector<DType> alt_dtypes;

  int64_t numel() const;
  uint64_t nbytes() const;
};

// For the EXL3 format, the bit width to put in the manifest's trellis shapes (the checker ignores
// it; mkmodel uses it). `bits_for(prefix)` may return different K per linear.
struct Exl3Plan {
  int default_bits = 3;
  int head_bits = 6;         // 16 = head left unquantized (F16)
  int mtp_bits = 0;          // K of the mtp.* linears; 0 = default_bits
  std::string codebook;      // "mul1", "mcg", "3inst"; empty = the config's codebook, else mul1
  std::map<std::string, int> per_linear;  // prefix -> K
  int bits_for(const std::string& prefix) const;
};

// The plan a config's quantization_config describes: K = round(bits) for every budgeted linear
// (clamped to 1..8), head_bits, mtp_bits and codebook when present, the defaults otherwise.
Exl3Plan exl3_plan_from_config(const ModelConfig& cfg);

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, CheckpointFormat fmt,
                                         const Exl3Plan& plan = {});

struct CheckOptions {
  // The Engram tables (`layers.L.engram.embed.{weight,scale}`) live elsewhere (--engram-dir):
  // their absence is not a problem, but if present they are still checked.
  bool engram_tables_external = false;
};

// Compares a checkpoint to the manifest: missing, unexpected, mis-shaped, mis-typed tensors, and
// invalid EXL3 linears (markers, K outside 1..8, suh/svh not matching the trellis). In the EXL3
// format any linear may also be stored unquantized (`<prefix>.weight`, F16/BF16/F32), as exllamav3
// decides per module. Returns one line per problem (empty when the checkpoint is complete).
std::vector<std::string> check_checkpoint(const ModelConfig& cfg, CheckpointFormat fmt, const Checkpoint& ckpt,
                                          const CheckOptions& opt = {});

// The format a config declares (quantization_config.quant_method); throws for anything else.
CheckpointFormat checkpoint_format(const ModelConfig& cfg);

const char* component_name(Component c);
// Component of a tensor name (by prefix), for tensors read from a checkpoint.
Component component_of(const std::string& name);

// EXL3 codebook markers (EXL3.md §1.3), as the int32 the file stores.
constexpr int32_t kExl3Mul1Marker = static_cast<int32_t>(0x83DCD12Du);
constexpr int32_t kExl3McgMarker = static_cast<int32_t>(0xCBAC1FEDu);

}  // namespace dsv41
