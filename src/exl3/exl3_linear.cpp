#include "dsv41/exl3/exl3_linear.h"

#include <cstring>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/loader/checkpoint.h"

namespace dsv41::exl3 {

namespace {
int64_t round_up_128(int64_t v) { return (v + kHadamardSize - 1) / kHadamardSize * kHadamardSize; }
}  // namespace

bool is_exl3_linear(const Checkpoint& ckpt, const std::string& prefix) { return ckpt.has(prefix + ".trellis"); }

std::unique_ptr<Linear> load_exl3_linear(const Checkpoint& ckpt, const std::string& prefix, int64_t in_features,
                                         int64_t out_features) {
  const TensorLookup find = [&](const std::string& name) { return ckpt.find(name); };
  Exl3Tensors t = read_exl3_tensors(find, prefix, "checkpoint " + ckpt.dir());
  if (t.k != round_up_128(in_features) || t.n != round_up_128(out_features)) {
    fail("checkpoint {}: tensor {}.trellis stores a {}x{} (k x n) weight, but the model expects in_features={} "
         "and out_features={} (padded {}x{})",
         ckpt.dir(), prefix, t.k, t.n, in_features, out_features, round_up_128(in_features),
         round_up_128(out_features));
  }
  return std::make_unique<Exl3Linear>(std::move(t), in_features, out_features);
}

Exl3Linear::Exl3Linear(Exl3Tensors storage, int64_t in_features, int64_t out_features)
    : t_(std::move(storage)), in_(in_features), out_(out_features) {
  DSV_CHECK(in_ > 0 && out_ > 0 && in_ <= t_.k && out_ <= t_.n && t_.k - in_ < kHadamardSize &&
                t_.n - out_ < kHadamardSize,
            "EXL3 linear {}: stored k={} n={} do not fit in_features={} out_features={} padded to 128", t_.prefix,
            t_.k, t_.n, in_, out_);
}

void Exl3Linear::forward(const float* x, int64_t m, float* y) const {
  if (m <= 0) return;
  const Exl3View v = t_.view();
  const bool pad_in = in_ != t_.k, pad_out = out_ != t_.n;
  std::vector<float> xp, yp;
  const float* xin = x;
  if (pad_in) {
    xp.assign(static_cast<size_t>(m * t_.k), 0.0f);  // padded inputs are zeros
    for (int64_t i = 0; i < m; ++i) std::memcpy(xp.data() + i * t_.k, x + i * in_, in_ * sizeof(float));
    xin = xp.data();
  }
  float* yout = y;
  if (pad_out) {
    yp.resize(static_cast<size_t>(m * t_.n));
    yout = yp.data();
  }
  exl3_matmul_f32(v, xin, m, yout);
  if (pad_out) {  // padded output columns hold quantization noise: drop them
    for (int64_t i = 0; i < m; ++i) std::memcpy(y + i * out_, yp.data() + i * t_.n, out_ * sizeof(float));
  }
}

}  // namespace dsv41::exl3
