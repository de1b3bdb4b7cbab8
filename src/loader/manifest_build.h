// Private to the loader: the manifest with the extra structure the checker needs (which tensors
// form one linear, so that an EXL3 linear may be stored quantized or not).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/loader/manifest.h"

namespace dsv41::manifest_detail {

// One linear of the model (HF orientation: weight [out, in]) in an EXL3 checkpoint.
struct Exl3Linear {
  std::string prefix;
  int64_t in = 0, out = 0;
  bool bias = false;      // the source linear has a bias (vision tower only)
  bool optional = false;  // may be absent altogether
};

struct Manifest {
  std::vector<TensorSpec> tensors;
  // Parallel to `tensors`: index into `linears` for tensors of an EXL3-format linear, else -1.
  std::vector<int> linear_of;
  std::vector<Exl3Linear> linears;  // empty for the FP8 format
};

Manifest build_manifest(const ModelConfig& cfg, CheckpointFormat fmt, const Exl3Plan& plan);

inline int64_t pad128(int64_t x) { return (x + 127) / 128 * 128; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool is_engram_table(const std::string& name);

}  // namespace dsv41::manifest_detail
