#include "mkmodel/value_rules.h"

#include <cmath>

#include "dsv41/common/error.h"
#include "dsv41/exl3/codebook.h"

namespace dsv41::mkmodel {

namespace {

constexpr float kE4m3CodeStd = 96.0f;
constexpr float kFp4CodeStd = 2.93f;       // std of the 16 e2m1 codes drawn uniformly
constexpr float kEngramEntryStd = 0.375f;  // 96 * 2^-8

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

FillRule normal(DType dt, float mean, float std) {
  FillRule r;
  r.kind = FillKind::kNormal;
  r.dtype = dt;
  r.mean = mean;
  r.std = std;
  return r;
}
FillRule constant(DType dt, float v) {
  FillRule r;
  r.kind = FillKind::kConst;
  r.dtype = dt;
  r.mean = v;
  return r;
}
int round_log2(double v) { return static_cast<int>(std::lround(std::log2(v))); }

std::string base_of(const std::string& name) { return name.substr(0, name.rfind('.')); }

}  // namespace

FillRule rule_for(const TensorSpec& t, const SpecIndex& index, const ModelConfig& cfg) {
  const std::string& n = t.name;
  // ---- EXL3 linears ----
  if (!t.exl3_linear.empty()) {
    const std::string& p = t.exl3_linear;
    if (t.exl3_trellis) {
      FillRule r;
      r.kind = FillKind::kRawBits;
      r.dtype = t.dtype;
      return r;
    }
    if (n == p + ".mul1" || n == p + ".mcg") {
      FillRule r;
      r.kind = FillKind::kMarker;
      r.dtype = DType::I32;
      r.marker = static_cast<int32_t>(n == p + ".mul1" ? exl3::kMul1Multiplier : exl3::kMcgMultiplier);
      return r;
    }
    if (n == p + ".suh" || n == p + ".svh") {
      FillRule r;
      r.kind = FillKind::kSignedScale;
      r.dtype = t.dtype;
      if (n == p + ".suh") {
        // Decoded codebook std (EXL3.md §2.5): MUL1 1.0, 3INST/MCG 1.244.
        const float cb_std = index.count(p + ".mul1") ? 1.0f : 1.244f;
        r.std = 1.0f / (cb_std * std::sqrt(static_cast<float>(t.shape.at(0))));
        r.jitter_frac = 0.0f;
      } else {
        r.std = 1.0f;
        r.jitter_frac = 0.2f;
      }
      return r;
    }
    if (n == p + ".bias") return constant(t.dtype, 0.0f);
    fail("mkmodel: no value rule for EXL3 tensor '{}'", n);
  }

  // ---- block-scaled FP8 / FP4 ----
  if (t.dtype == DType::F8_E4M3) {
    FillRule r;
    r.kind = FillKind::kE4m3Normal;
    r.dtype = t.dtype;
    r.std = kE4m3CodeStd;
    return r;
  }
  if (t.dtype == DType::I8 && ends_with(n, ".weight")) {  // packed e2m1 pairs
    FillRule r;
    r.kind = FillKind::kRawBits;
    r.dtype = t.dtype;
    return r;
  }
  if (t.dtype == DType::F8_E8M0) {
    auto it = index.find(base_of(n) + ".weight");
    if (it == index.end() || it->second->shape.size() != 2)
      fail("mkmodel: scale tensor '{}' has no matching 2-D .weight", n);
    const TensorSpec& w = *it->second;
    FillRule r;
    r.kind = FillKind::kE8m0;
    r.dtype = t.dtype;
    if (contains(n, ".engram.embed.")) {
      r.exponent = round_log2(kEngramEntryStd / kE4m3CodeStd);
    } else if (w.dtype == DType::I8) {
      const double in = 2.0 * static_cast<double>(w.shape[1]);
      r.exponent = round_log2(1.0 / (kFp4CodeStd * std::sqrt(in)));
      r.jitter = 1;
    } else if (w.dtype == DType::F8_E4M3) {
      const double in = static_cast<double>(w.shape[1]);
      r.exponent = round_log2(1.0 / (kE4m3CodeStd * std::sqrt(in)));
      r.jitter = 1;
    } else {
      fail("mkmodel: scale tensor '{}' belongs to a {} weight", n, dtype_name(w.dtype));
    }
    return r;
  }

  // ---- plain float tensors ----
  if (!is_float(t.dtype)) fail("mkmodel: no value rule for tensor '{}' of dtype {}", n, dtype_name(t.dtype));
  const DType dt = t.dtype;
  const int64_t last = t.shape.empty() ? 1 : t.shape.back();
  if (t.shape.size() == 1 && contains(n, "norm") && ends_with(n, ".weight")) return normal(dt, 1.0f, 0.05f);
  if (ends_with(n, "gate.bias") || ends_with(n, "gate.bias_vl") || ends_with(n, ".bias")) return constant(dt, 0.0f);
  if (contains(n, "hc_") && ends_with(n, "_fn")) return normal(dt, 0.0f, 1.0f / std::sqrt(static_cast<float>(last)));
  if (contains(n, "hc_") && (ends_with(n, "_base") || ends_with(n, "_scale"))) return normal(dt, 0.0f, 0.1f);
  if (ends_with(n, "attn_sink")) return normal(dt, 0.0f, 0.5f);
  if (n == "embed.weight" || ends_with(n, "markov_head.embed.weight") || n.rfind("image_", 0) == 0)
    return normal(dt, 0.0f, 0.1f);
  // Linears [out, in] and the Engram q/k weights [hc, dim]: 1/sqrt(fan-in).
  (void)cfg;
  return normal(dt, 0.0f, 1.0f / std::sqrt(static_cast<float>(last)));
}

}  // namespace dsv41::mkmodel
