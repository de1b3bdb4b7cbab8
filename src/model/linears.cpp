#include "model/ops/dot.h"
#include "model/linears.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"
#include "dsv41/exl3/exl3_linear.h"
#include "model/ops/quant.h"

namespace dsv41::model {
namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = e4m3_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

// Block scales stay the stored E8M0 bytes (memory-mapped) and are widened through this table at
// use: the same float as converting at load, without expanding ~0.4 G scales per layer.
const std::array<float, 256>& e8m0_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = e8m0_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

// Rows per parallel_for task in the load-time conversions (large enough to amortise the dispatch).
int64_t rows_per_task(int64_t row_elems) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, row_elems));
}

void check_shape(const TensorInfo& t, std::vector<int64_t> want) {
  if (t.shape != want) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    fail("tensor {} has shape {}, expected {}]", t.name, t.shape_str(), w);
  }
}

// y = x·Wᵀ for the block-scaled formats (Lin8, Lin4) as the reference computes it: each row of x
// quantised per 32 (ActQuant8), then per output o the 32-wide partial sums in block order, each
// scaled by the activation scale and then the weight scale. block(o, kb, xq) returns the partial
// sum of block kb against the 32 quantised inputs xq, and the weight scale of that block.
template <class Block>
void block_scaled_forward(const float* x, int64_t m, float* y, int64_t in, int64_t out, Block block) {
  const int64_t nb = in / 32;
  std::vector<float> codes(static_cast<size_t>(in)), as(static_cast<size_t>(nb));
  for (int64_t r = 0; r < m; ++r) {
    act_quant8(x + r * in, in, codes.data(), as.data());
    parallel_for(out, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        float acc = 0.0f;
        for (int64_t kb = 0; kb < nb; ++kb) {
          const auto [part, w_scale] = block(o, kb, codes.data() + kb * 32);
          acc += part * as[kb] * w_scale;
        }
        y[r * out + o] = acc;
      }
    }, std::max<int64_t>(1, 8192 / in));
  }
}

class Lin8 final : public Linear {
 public:
  Lin8(const TensorInfo& w, const TensorInfo& s, int64_t in, int64_t out) : in_(in), out_(out), codes_(w.data) {
    check_shape(w, {out, in});
    check_shape(s, {(out + 31) / 32, (in + 31) / 32});
    DSV_CHECK(in % 32 == 0, "tensor {}: in_features {} is not a multiple of 32", w.name, in);
    scales_ = s.data;
    bytes_ = w.nbytes + s.nbytes;
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  uint64_t weight_bytes() const override { return bytes_; }
  void forward(const float* x, int64_t m, float* y) const override {
    const auto& lut = e4m3_table();
    const auto& scale_of = e8m0_table();
    const int64_t nb = in_ / 32;
    block_scaled_forward(x, m, y, in_, out_, [&](int64_t o, int64_t kb, const float* xq) {
      const uint8_t* w = codes_ + o * in_ + kb * 32;
      float part = 0.0f;
      for (int i = 0; i < 32; ++i) part += xq[i] * lut[w[i]];
      return std::pair{part, scale_of[scales_[(o / 32) * nb + kb]]};
    });
  }

 private:
  int64_t in_, out_;
  const uint8_t* codes_;
  const uint8_t* scales_;  // E8M0 bytes, [ceil(out/32), in/32]
  uint64_t bytes_ = 0;
};

class Lin4 final : public Linear {
 public:
  Lin4(const TensorInfo& w, const TensorInfo& s, int64_t in, int64_t out) : in_(in), out_(out), packed_(w.data) {
    DSV_CHECK(in % 32 == 0, "tensor {}: in_features {} is not a multiple of 32", w.name, in);
    check_shape(w, {out, in / 2});
    check_shape(s, {out, in / 32});
    scales_ = s.data;
    bytes_ = w.nbytes + s.nbytes;
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  uint64_t weight_bytes() const override { return bytes_; }
  void forward(const float* x, int64_t m, float* y) const override {
    const auto& scale_of = e8m0_table();
    const int64_t nb = in_ / 32;
    block_scaled_forward(x, m, y, in_, out_, [&](int64_t o, int64_t kb, const float* xq) {
      const uint8_t* w = packed_ + o * (in_ / 2) + kb * 16;
      float part = 0.0f;
      for (int i = 0; i < 16; ++i) {
        part += xq[2 * i] * e2m1_to_f32(w[i] & 0xF);
        part += xq[2 * i + 1] * e2m1_to_f32(w[i] >> 4);
      }
      return std::pair{part, scale_of[scales_[o * nb + kb]]};
    });
  }

 private:
  int64_t in_, out_;
  const uint8_t* packed_;
  const uint8_t* scales_;  // E8M0 bytes, [out, in/32]
  uint64_t bytes_ = 0;
};

// Dense fp32 weights (bf16 values for LinBF16); fp32 accumulation in K order.
class LinDense final : public Linear {
 public:
  LinDense(std::vector<float> w, int64_t in, int64_t out, uint64_t bytes)
      : in_(in), out_(out), w_(std::move(w)), bytes_(bytes) {}
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  uint64_t weight_bytes() const override { return bytes_; }
  void forward(const float* x, int64_t m, float* y) const override {
    parallel_for(m * out_, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = i / out_, o = i % out_;
        const float* xr = x + r * in_;
        const float* wr = w_.data() + o * in_;
        y[i] = gemm_dot_f32(xr, wr, in_);
      }
    }, std::max<int64_t>(1, 8192 / in_));
  }

 private:
  int64_t in_, out_;
  std::vector<float> w_;
  uint64_t bytes_;
};

}  // namespace

std::vector<float> load_dense_weight(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out) {
  return load_dense_weight_rows(ckpt, prefix, in, out, 0, out);
}

std::vector<float> load_dense_weight_rows(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                                          int64_t row_begin, int64_t row_end) {
  const TensorInfo& w = ckpt.get(prefix + ".weight");
  check_shape(w, {out, in});
  DSV_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= out, "{}: row slice [{}, {}) of {} rows", prefix,
            row_begin, row_end, out);
  const int64_t rows = row_end - row_begin;
  if (w.dtype == DType::F8_E4M3) {
    const TensorInfo& s = ckpt.get(prefix + ".scale");
    check_shape(s, {(out + 31) / 32, (in + 31) / 32});
    const int64_t nb = (in + 31) / 32;
    const auto& code = e4m3_table();
    const auto& scale = e8m0_table();
    std::vector<float> v(static_cast<size_t>(rows * in));
    parallel_for(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = row_begin + r;
        for (int64_t k = 0; k < in; ++k)
          v[r * in + k] = code[w.data[o * in + k]] * scale[s.data[(o / 32) * nb + k / 32]];
      }
    }, rows_per_task(in));
    return v;
  }
  DSV_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F32 || w.dtype == DType::F16,
            "tensor {}: unsupported dtype {} for a dense weight (expected F8_E4M3, BF16, F16 or F32)", w.name,
            dtype_name(w.dtype));
  if (rows == out) return tensor_to_f32(w);
  const int64_t row_bytes = in * static_cast<int64_t>(dtype_size(w.dtype));
  TensorInfo part = w;
  part.shape[0] = rows;
  part.data = w.data + row_begin * row_bytes;
  part.nbytes = static_cast<uint64_t>(rows * row_bytes);
  return tensor_to_f32(part);
}

void round_to_bf16(std::vector<float>& v) {
  parallel_for(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)] = bf16_round(v[static_cast<size_t>(i)]);
  }, int64_t{1} << 16);
}

std::unique_ptr<Linear> make_dense_linear(std::vector<float> w, int64_t in, int64_t out) {
  DSV_ASSERT(static_cast<int64_t>(w.size()) == in * out, "dense linear size");
  return std::make_unique<LinDense>(std::move(w), in, out, static_cast<uint64_t>(in * out * 2));
}

namespace {

// The dense fp32 values of rows [row_begin, row_end) of a plain linear after loading.
std::vector<float> dense_values(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                                LinearKind kind, int64_t row_begin, int64_t row_end) {
  std::vector<float> v = load_dense_weight_rows(ckpt, prefix, in, out, row_begin, row_end);
  // Only a dequantised FP8 weight needs rounding to reach the BF16 values the reference holds;
  // BF16, F16 (EXL3's unquantized linears) and F32 weights are used exactly as stored.
  if (kind == LinearKind::kBF16 && ckpt.get(prefix + ".weight").dtype == DType::F8_E4M3) round_to_bf16(v);
  return v;
}

}  // namespace

std::unique_ptr<Linear> load_linear(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                                    LinearKind kind) {
  if (ckpt.has(prefix + ".trellis")) return exl3::load_exl3_linear(ckpt, prefix, in, out);
  const TensorInfo& w = ckpt.get(prefix + ".weight");
  if (kind == LinearKind::kAuto && w.dtype == DType::F8_E4M3)
    return std::make_unique<Lin8>(w, ckpt.get(prefix + ".scale"), in, out);
  if (kind == LinearKind::kAuto && w.dtype == DType::I8)
    return std::make_unique<Lin4>(w, ckpt.get(prefix + ".scale"), in, out);
  return std::make_unique<LinDense>(dense_values(ckpt, prefix, in, out, kind, 0, out), in, out, w.nbytes);
}

namespace {

// Outputs [begin, end) of a linear that cannot be cut by rows (EXL3): computes all, keeps the slice.
class RowsOfFullLinear final : public Linear {
 public:
  RowsOfFullLinear(std::unique_ptr<Linear> full, int64_t begin, int64_t end)
      : full_(std::move(full)), begin_(begin), end_(end) {}
  int64_t in_features() const override { return full_->in_features(); }
  int64_t out_features() const override { return end_ - begin_; }
  uint64_t weight_bytes() const override { return full_->weight_bytes(); }
  void forward(const float* x, int64_t m, float* y) const override {
    const int64_t out = full_->out_features(), k = end_ - begin_;
    std::vector<float> all(static_cast<size_t>(m * out));
    full_->forward(x, m, all.data());
    for (int64_t r = 0; r < m; ++r) std::copy_n(&all[r * out + begin_], k, y + r * k);
  }

 private:
  std::unique_ptr<Linear> full_;
  int64_t begin_, end_;
};

// A view of rows [begin, begin + rows) of a row-major tensor whose rows are `row_bytes` long.
TensorInfo row_view(const TensorInfo& t, int64_t begin, int64_t rows, int64_t row_bytes) {
  TensorInfo v = t;
  v.shape[0] = rows;
  v.data = t.data + begin * row_bytes;
  v.nbytes = static_cast<uint64_t>(rows * row_bytes);
  return v;
}

}  // namespace

std::unique_ptr<Linear> load_linear_rows(const Checkpoint& ckpt, const std::string& prefix, int64_t in, int64_t out,
                                         int64_t row_begin, int64_t row_end, LinearKind kind) {
  DSV_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= out, "{}: row slice [{}, {}) of {} rows", prefix,
            row_begin, row_end, out);
  if (row_begin == 0 && row_end == out) return load_linear(ckpt, prefix, in, out, kind);
  const int64_t rows = row_end - row_begin;
  if (ckpt.has(prefix + ".trellis"))
    return std::make_unique<RowsOfFullLinear>(exl3::load_exl3_linear(ckpt, prefix, in, out), row_begin, row_end);
  const TensorInfo& w = ckpt.get(prefix + ".weight");
  if (kind == LinearKind::kAuto && w.dtype == DType::F8_E4M3) {
    const TensorInfo& s = ckpt.get(prefix + ".scale");
    check_shape(w, {out, in});
    check_shape(s, {(out + 31) / 32, (in + 31) / 32});
    DSV_CHECK(row_begin % 32 == 0, "{}: an FP8 row slice must start at a multiple of 32 (got {})", prefix, row_begin);
    const int64_t nb = (in + 31) / 32;
    return std::make_unique<Lin8>(row_view(w, row_begin, rows, in), row_view(s, row_begin / 32, (rows + 31) / 32, nb),
                                  in, rows);
  }
  if (kind == LinearKind::kAuto && w.dtype == DType::I8) {
    const TensorInfo& s = ckpt.get(prefix + ".scale");
    check_shape(w, {out, in / 2});
    check_shape(s, {out, in / 32});
    return std::make_unique<Lin4>(row_view(w, row_begin, rows, in / 2), row_view(s, row_begin, rows, in / 32), in,
                                  rows);
  }
  return std::make_unique<LinDense>(dense_values(ckpt, prefix, in, out, kind, row_begin, row_end), in, rows,
                                    w.nbytes / static_cast<uint64_t>(out) * rows);
}

void linear_bf16(const Linear& lin, const float* x, int64_t m, float* y) {
  lin.forward(x, m, y);
  const int64_t n = m * lin.out_features();
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_round(y[i]);
}

}  // namespace dsv41::model
