// fp32 sums in the order of PyTorch's CPU reduction kernel (the reference runs on PyTorch CPU):
// the row is read as vectors of `lanes` floats, accumulated in 4 interleaved vector accumulators
// with a 4-level cascade, the 4 accumulators added, then the lanes added left to right. Sums of
// many rounded fp32 terms (norm statistics, the Engram gate dot) depend on this order at the last
// ulp, and a flipped sign of a near-zero Engram dot moves the gate visibly.
#pragma once
#include <cstdint>

namespace dsv41::model {

// Vector width of the reference's reduction kernel (8 = AVX2 floats).
inline constexpr int kTorchSumLanes = 8;

float torch_sum_f32(const float* x, int64_t n, int lanes = kTorchSumLanes);
// mean(x²) with the squares rounded to fp32 first, as x.square().mean(-1) does.
float torch_mean_sq_f32(const float* x, int64_t n, int lanes = kTorchSumLanes);

}  // namespace dsv41::model
