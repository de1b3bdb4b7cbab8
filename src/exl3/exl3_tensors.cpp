#include "dsv41/exl3/exl3_tensors.h"

#include <cmath>
#include <cstring>

#include "dsv41/common/error.h"

namespace dsv41::exl3 {

Exl3Tensors::Exl3Tensors(Exl3Tensors&& o) noexcept { *this = std::move(o); }

Exl3Tensors& Exl3Tensors::operator=(Exl3Tensors&& o) noexcept {
  if (this == &o) return *this;
  const bool owned = o.trellis != nullptr && o.trellis == o.owned_trellis.data();
  prefix = std::move(o.prefix);
  k = o.k;
  n = o.n;
  K = o.K;
  codebook = o.codebook;
  legacy_signs = o.legacy_signs;
  owned_trellis = std::move(o.owned_trellis);
  trellis = owned ? owned_trellis.data() : o.trellis;
  suh = std::move(o.suh);
  svh = std::move(o.svh);
  bias = std::move(o.bias);
  o.trellis = nullptr;
  return *this;
}

Exl3View Exl3Tensors::view() const {
  Exl3View v;
  v.trellis = trellis;
  v.k = k;
  v.n = n;
  v.K = K;
  v.codebook = codebook;
  v.suh = suh.data();
  v.svh = svh.data();
  v.bias = bias.empty() ? nullptr : bias.data();
  return v;
}

uint64_t Exl3Tensors::stored_bytes() const {
  return trellis_bytes() + 2ull * static_cast<uint64_t>(k + n) + (bias.empty() ? 0 : 2ull * n);
}

bool has_exl3_tensors(const TensorLookup& find, const std::string& prefix) {
  return find(prefix + ".trellis") != nullptr;
}

std::vector<float> unpack_sign_bits(const uint16_t* words, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = ((words[i / 16] >> (i % 16)) & 1) ? -1.0f : 1.0f;
  return out;
}

namespace {

bool is_float_dtype(DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32; }

std::vector<float> read_vector(const TensorInfo& t, int64_t len, const std::string& where) {
  DSV_CHECK(is_float_dtype(t.dtype), "{}: tensor {} has dtype {}, expected F16", where, t.name, dtype_name(t.dtype));
  DSV_CHECK(t.shape.size() == 1 && t.shape[0] == len, "{}: tensor {} has shape {}, expected [{}]", where, t.name,
            t.shape_str(), len);
  std::vector<float> v = tensor_to_f32(t);
  for (int64_t i = 0; i < len; ++i) {
    DSV_CHECK(std::isfinite(v[i]), "{}: tensor {} has a non-finite value at index {}", where, t.name, i);
  }
  return v;
}

std::vector<float> read_signs(const TensorInfo& t, int64_t len, const std::string& where) {
  DSV_CHECK(t.dtype == DType::I16, "{}: tensor {} has dtype {}, expected I16 packed signs", where, t.name,
            dtype_name(t.dtype));
  DSV_CHECK(t.shape.size() == 1 && t.shape[0] == len / 16, "{}: tensor {} has shape {}, expected [{}]", where,
            t.name, t.shape_str(), len / 16);
  std::vector<uint16_t> words(static_cast<size_t>(len / 16));
  std::memcpy(words.data(), t.data, words.size() * 2);
  return unpack_sign_bits(words.data(), len);
}

void check_marker(const TensorInfo& t, uint32_t expected, const std::string& where) {
  DSV_CHECK(t.dtype == DType::I32 && t.numel() == 1 && t.shape.size() <= 1,
            "{}: codebook marker {} must be an I32 scalar, found {} {}", where, t.name, dtype_name(t.dtype),
            t.shape_str());
  int32_t v;
  std::memcpy(&v, t.data, 4);
  DSV_CHECK(static_cast<uint32_t>(v) == expected, "{}: codebook marker {} holds {} (0x{:08X}), expected {} (0x{:08X})",
            where, t.name, v, static_cast<uint32_t>(v), static_cast<int32_t>(expected), expected);
}

}  // namespace

Exl3Tensors read_exl3_tensors(const TensorLookup& find, const std::string& prefix, const std::string& where) {
  Exl3Tensors out;
  out.prefix = prefix;
  const TensorInfo* tr = find(prefix + ".trellis");
  DSV_CHECK(tr != nullptr, "{}: missing tensor {}.trellis", where, prefix);
  DSV_CHECK(tr->dtype == DType::I16, "{}: tensor {} has dtype {}, expected I16", where, tr->name,
            dtype_name(tr->dtype));
  DSV_CHECK(tr->shape.size() == 3 && tr->shape[0] > 0 && tr->shape[1] > 0 && tr->shape[2] > 0,
            "{}: tensor {} has shape {}, expected [k/16, n/16, 16*K]", where, tr->name, tr->shape_str());
  DSV_CHECK(tr->shape[2] % 16 == 0 && tr->shape[2] / 16 >= 1 && tr->shape[2] / 16 <= 8,
            "{}: tensor {} has last dim {}, expected 16*K with K in 1..8", where, tr->name, tr->shape[2]);
  out.K = static_cast<int>(tr->shape[2] / 16);
  out.k = tr->shape[0] * kTile;
  out.n = tr->shape[1] * kTile;
  DSV_CHECK(out.k % kHadamardSize == 0 && out.n % kHadamardSize == 0,
            "{}: tensor {} has shape {}: k={} and n={} must be multiples of 128", where, tr->name, tr->shape_str(),
            out.k, out.n);
  if (reinterpret_cast<uintptr_t>(tr->data) % alignof(uint16_t) == 0) {
    out.trellis = reinterpret_cast<const uint16_t*>(tr->data);
  } else {
    out.owned_trellis.resize(static_cast<size_t>(tr->numel()));
    std::memcpy(out.owned_trellis.data(), tr->data, tr->nbytes);
    out.trellis = out.owned_trellis.data();
  }

  const TensorInfo* suh = find(prefix + ".suh");
  const TensorInfo* svh = find(prefix + ".svh");
  const TensorInfo* su = find(prefix + ".su");
  const TensorInfo* sv = find(prefix + ".sv");
  if (suh || svh) {
    DSV_CHECK(suh && svh, "{}: EXL3 linear {} has only one of suh/svh", where, prefix);
    DSV_CHECK(!su && !sv, "{}: EXL3 linear {} has both suh/svh and legacy su/sv", where, prefix);
    out.suh = read_vector(*suh, out.k, where);
    out.svh = read_vector(*svh, out.n, where);
  } else {
    DSV_CHECK(su && sv, "{}: EXL3 linear {} has neither suh/svh nor legacy su/sv", where, prefix);
    DSV_CHECK(find(prefix + ".scale") == nullptr,
              "{}: EXL3 linear {} carries a legacy {}.scale tensor (format older than exllamav3 v1.4 is not supported)",
              where, prefix, prefix);
    out.legacy_signs = true;
    out.suh = read_signs(*su, out.k, where);
    out.svh = read_signs(*sv, out.n, where);
  }

  const TensorInfo* mul1 = find(prefix + ".mul1");
  const TensorInfo* mcg = find(prefix + ".mcg");
  DSV_CHECK(!(mul1 && mcg), "{}: EXL3 linear {} has both mul1 and mcg codebook markers", where, prefix);
  if (mul1) {
    check_marker(*mul1, kMul1Multiplier, where);
    out.codebook = Codebook::kMul1;
  } else if (mcg) {
    check_marker(*mcg, kMcgMultiplier, where);
    out.codebook = Codebook::kMcg;
  } else {
    out.codebook = Codebook::k3Inst;
  }

  if (const TensorInfo* b = find(prefix + ".bias")) {
    DSV_CHECK(is_float_dtype(b->dtype), "{}: tensor {} has dtype {}, expected F16", where, b->name,
              dtype_name(b->dtype));
    const int64_t len = b->numel();
    // Stored padded to n; an unpadded [out_features] bias is accepted and zero-extended.
    DSV_CHECK(b->shape.size() == 1 && len <= out.n && len > out.n - kHadamardSize,
              "{}: tensor {} has shape {}, expected [{}]", where, b->name, b->shape_str(), out.n);
    out.bias = read_vector(*b, len, where);
    out.bias.resize(static_cast<size_t>(out.n), 0.0f);
  }
  return out;
}

}  // namespace dsv41::exl3
