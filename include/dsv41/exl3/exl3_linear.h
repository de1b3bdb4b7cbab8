// EXL3 linears in a checkpoint (EXL3.md §1.3): `<prefix>.trellis` [k/16, n/16, 16K] I16,
// `<prefix>.suh` [k] F16, `<prefix>.svh` [n] F16 (or legacy packed signs `<prefix>.su`/`.sv`), a
// codebook marker `<prefix>.mul1|mcg` (none = 3INST), optional `<prefix>.bias` [n]; k, n padded
// to multiples of 128.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "dsv41/exl3/exl3_tensors.h"
#include "dsv41/model/linear.h"

namespace dsv41 {
class Checkpoint;
}

namespace dsv41::exl3 {

// True when `<prefix>.trellis` exists in the checkpoint.
bool is_exl3_linear(const Checkpoint& ckpt, const std::string& prefix);

// Loads and validates one EXL3 linear whose logical shape is [out_features, in_features] (the
// stored k, n must equal them rounded up to 128). Throws dsv41::Error naming the tensor on any
// defect. The trellis stays in the checkpoint's mapping: `ckpt` must outlive the returned Linear.
// forward() zero-extends inputs to k and trims outputs to out_features.
std::unique_ptr<Linear> load_exl3_linear(const Checkpoint& ckpt, const std::string& prefix,
                                         int64_t in_features, int64_t out_features);

// The CPU EXL3 linear. A GPU backend can dynamic_cast a Linear to this to reach the storage.
class Exl3Linear final : public Linear {
 public:
  // Throws dsv41::Error when the padded storage does not fit [out_features, in_features].
  Exl3Linear(Exl3Tensors storage, int64_t in_features, int64_t out_features);
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  // y = x . W (+ bias), fp32, via exl3_matmul_f32 on zero-extended inputs; outputs trimmed.
  void forward(const float* x, int64_t m, float* y) const override;
  uint64_t weight_bytes() const override { return t_.stored_bytes(); }
  const Exl3Tensors& storage() const { return t_; }

 private:
  Exl3Tensors t_;
  int64_t in_, out_;
};

}  // namespace dsv41::exl3
