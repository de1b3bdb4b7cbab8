// The reference's linear layers (MODEL.md §4) behind the dsv41::Linear interface:
//  - Lin8:   FP8 e4m3 weight [out,in] with E8M0 32x32 block scales; the activation is quantised
//            with ActQuant8 and each 32-wide K block's exact code dot is scaled and added in K order.
//  - Lin4:   FP4 e2m1 weight (two codes per byte, low nibble = even column) with per-row per-32
//            E8M0 scales; same activation quantisation and block order.
//  - LinBF16 / LinF32: plain fp32-accumulated dot products over bf16 / fp32 weights.
// forward() returns fp32 sums; the caller rounds to bf16 where the reference does.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/linear.h"

namespace dsv41::model {

// Weight storage format of a plain (non-EXL3) linear as the reference holds it after loading.
enum class LinearKind { kAuto, kBF16, kF32 };

// Builds the linear stored under `prefix` (`prefix.weight` [+ `prefix.scale`], or EXL3 tensors).
// kAuto picks from the stored dtype: F8_E4M3 -> Lin8, I8 -> Lin4, BF16 -> LinBF16, F32 -> LinF32,
// F16 (an EXL3 checkpoint's unquantized linears, EXL3.md §1.8) -> dense over the exact F16 values.
// kBF16 / kF32 force a dense weight (e.g. an FP8 weight the reference dequantises, or a BF16
// weight it widens to fp32; only FP8 -> kBF16 rounds, every other widening is exact).
// Throws dsv41::Error naming the tensor when a shape or dtype does not match [out, in].
std::unique_ptr<Linear> load_linear(const Checkpoint& ckpt, const std::string& prefix, int64_t in,
                                    int64_t out, LinearKind kind = LinearKind::kAuto);

// Tensor parallel: rows [row_begin, row_end) of the linear stored under `prefix` (a rank's share of
// the outputs), as a linear with row_end - row_begin outputs whose values equal those rows of the
// full linear bit for bit. FP8 needs row_begin % 32 == 0 (its 32x32 scale blocks). An EXL3 linear
// cannot be cut by rows; it computes all outputs and keeps the slice (exact, not memory-split).
std::unique_ptr<Linear> load_linear_rows(const Checkpoint& ckpt, const std::string& prefix, int64_t in,
                                         int64_t out, int64_t row_begin, int64_t row_end,
                                         LinearKind kind = LinearKind::kAuto);

// Dense fp32 copy of a stored weight [out,in] (BF16, F16, F32, or FP8 with block scales dequantised).
std::vector<float> load_dense_weight(const Checkpoint& ckpt, const std::string& prefix, int64_t in,
                                     int64_t out);
// Rows [row_begin, row_end) of load_dense_weight's result, converting only those rows.
std::vector<float> load_dense_weight_rows(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                                          int64_t row_begin, int64_t row_end);

// Rounds every value to the nearest bf16 (RNE) in place, in parallel (load-time conversion).
void round_to_bf16(std::vector<float>& v);

// A linear over an in-memory dense fp32 weight (values already rounded as the reference holds them).
std::unique_ptr<Linear> make_dense_linear(std::vector<float> w, int64_t in, int64_t out);

// Applies the linear to m rows and rounds every output to bf16 (the reference's default dtype).
void linear_bf16(const Linear& lin, const float* x, int64_t m, float* y);

}  // namespace dsv41::model
