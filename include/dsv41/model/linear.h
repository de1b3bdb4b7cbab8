// A linear layer as the model code sees it, whatever the storage format (FP8 block-scaled,
// FP4 experts, BF16, F32, EXL3). Weights are in HF orientation: W is [out_features, in_features].
#pragma once
#include <cstdint>

namespace dsv41 {

class Linear {
 public:
  virtual ~Linear() = default;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  // y[m][out] = sum_k x[m][k] * W[out][k]. x holds m rows of in_features values (the model's
  // bf16 activations widened to float); y receives m rows of out_features fp32 values. Format-
  // specific numerics (e.g. FP8 activation quantisation, MODEL.md §4 Lin8/Lin4) happen inside;
  // the caller applies the reference's output rounding (bf16) where MODEL.md says so.
  virtual void forward(const float* x, int64_t m, float* y) const = 0;
  // Bytes of weight storage read by one forward (for inspect/bench accounting).
  virtual uint64_t weight_bytes() const = 0;
};

}  // namespace dsv41
