// EXL3 linears in a checkpoint (EXL3.md §1.3): `<prefix>.trellis` [k/16, n/16, 16K] I16,
// `<prefix>.suh` [k] F16, `<prefix>.svh` [n] F16, a codebook marker `<prefix>.mul1|mcg` (none =
// 3INST), optional `<prefix>.bias` [n]; k, n padded to multiples of 128.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "dsv41/model/linear.h"

namespace dsv41 {
class Checkpoint;
}

namespace dsv41::exl3 {

// True when `<prefix>.trellis` exists in the checkpoint.
bool is_exl3_linear(const Checkpoint& ckpt, const std::string& prefix);

// Loads and validates one EXL3 linear whose logical shape is [out_features, in_features] (the
// stored k, n may be padded up to 128). Throws dsv41::Error naming the tensor on any defect.
// forward() zero-extends inputs to k and trims outputs to out_features.
std::unique_ptr<Linear> load_exl3_linear(const Checkpoint& ckpt, const std::string& prefix,
                                         int64_t in_features, int64_t out_features);

}  // namespace dsv41::exl3
