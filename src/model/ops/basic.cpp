#include <algorithm>
#include <cmath>
#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "model/ops/torch_sum.h"
#include "model/cpu_impl.h"

namespace dsv41::model {

void rms_norm(const float* x, const float* w, int64_t d, double eps, float* out) {
  const float var = torch_mean_sq_f32(x, d);
  const float r = 1.0f / std::sqrt(var + static_cast<float>(eps));
  for (int64_t i = 0; i < d; ++i) out[i] = bf16_round(w[i] * (x[i] * r));
}

void swiglu_rows(const float* g, const float* u, const float* row_weight, int64_t rows, int64_t inter, double limit,
                 float* out) {
  const float lim = static_cast<float>(limit);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      float gv = g[t * inter + i], uv = u[t * inter + i];
      if (lim > 0) {
        uv = std::clamp(uv, -lim, lim);
        gv = std::min(gv, lim);
      }
      float act = gv / (1.0f + std::exp(-gv)) * uv;
      if (row_weight) act = row_weight[t] * act;
      out[t * inter + i] = bf16_round(act);
    }
}

std::vector<float> load_f32(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape) {
  const TensorInfo& t = ck.get(name);
  if (t.shape != shape) {
    std::string w;
    for (size_t i = 0; i < shape.size(); ++i) w += (i ? ", " : "") + std::to_string(shape[i]);
    fail("tensor {} has shape {}, expected [{}]", name, t.shape_str(), w);
  }
  DSV_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32 || t.dtype == DType::F16,
            "tensor {}: dtype {} where BF16/F16/F32 is expected", name, dtype_name(t.dtype));
  return tensor_to_f32(t);
}

void tensor_row_f32(const TensorInfo& t, int64_t r, float* out) {
  const int64_t d = t.shape.at(1);
  if (t.dtype == DType::BF16) {
    const uint8_t* p = t.data + r * d * 2;
    for (int64_t i = 0; i < d; ++i) {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      out[i] = bf16_bits_to_f32(b);
    }
  } else if (t.dtype == DType::F32) {
    std::memcpy(out, t.data + r * d * 4, static_cast<size_t>(d) * 4);
  } else if (t.dtype == DType::F16) {  // EXL3 checkpoints keep unquantized tensors as F16
    const uint8_t* p = t.data + r * d * 2;
    for (int64_t i = 0; i < d; ++i) {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      out[i] = f16_bits_to_f32(b);
    }
  } else {
    fail("tensor {}: dtype {} where BF16/F16/F32 is expected", t.name, dtype_name(t.dtype));
  }
}

}  // namespace dsv41::model
