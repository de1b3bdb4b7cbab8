// Dense twins of EXL3 checkpoints: a copy in which chosen EXL3 linears are stored unquantized, as
// their effective weight W (exl3::full_weight_f32, `<prefix>.weight` [out, in]), the form
// exllamav3 uses for linears it leaves unquantized. Used by the CPU format tests (every linear,
// F32: the engine must compute the same model through other code) and the CUDA parity tests (the
// wo_a slices only, F16: the per-group output projection in its unquantized form).
#pragma once
#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "dsv41/common/numeric.h"
#include "dsv41/config/model_config.h"
#include "dsv41/exl3/exl3_tensors.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "loader/manifest_build.h"

namespace dsv41::test {

// Re-stores a BF16/F32 tensor as F16 when every value survives the round trip, else as F32.
inline void add_widened(SafetensorsWriter& w, const TensorInfo& t) {
  const std::vector<float> v = tensor_to_f32(t);
  bool f16_exact = true;
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size() && f16_exact; ++i) {
    h[i] = f32_to_f16_bits(v[i]);
    f16_exact = f16_bits_to_f32(h[i]) == v[i];
  }
  if (f16_exact) w.add(t.name, DType::F16, t.shape, h);
  else w.add(t.name, DType::F32, t.shape, v);
}

struct DenseTwinOptions {
  std::function<bool(const std::string& prefix)> replace;  // which EXL3 linears (null: all)
  DType dtype = DType::F32;    // F32 (exact effective weight) or F16 (rounded, as exllamav3 stores)
  bool widen_others = false;   // re-store every other BF16/F32 tensor as F16 where exact, else F32
};

// Writes the twin of the EXL3 checkpoint `src` into folder `out` (config.json and one shard).
// Returns the number of EXL3 linears replaced.
inline int write_dense_twin(const std::string& src, const std::string& out, const DenseTwinOptions& o = {}) {
  const ModelConfig cfg = load_model_config(src + "/config.json");
  const auto manifest = manifest_detail::build_manifest(cfg, CheckpointFormat::kExl3, exl3_plan_from_config(cfg));
  auto ck = Checkpoint::open(src);
  const exl3::TensorLookup find = [&](const std::string& n) { return ck->find(n); };
  SafetensorsWriter w;
  std::vector<std::string> replaced;  // tensor names that belong to a replaced EXL3 linear
  int n_linears = 0;
  for (const auto& lin : manifest.linears) {
    if (!ck->has(lin.prefix + ".trellis") || (o.replace && !o.replace(lin.prefix))) continue;
    const exl3::Exl3Tensors t = exl3::read_exl3_tensors(find, lin.prefix, src);
    const std::vector<float> full = exl3::full_weight_f32(t.view());  // [k][n]
    std::vector<float> wt(static_cast<size_t>(lin.out * lin.in));  // [out][in]
    for (int64_t r = 0; r < lin.out; ++r)
      for (int64_t i = 0; i < lin.in; ++i) wt[r * lin.in + i] = full[i * t.n + r];
    if (o.dtype == DType::F16) {
      std::vector<uint16_t> h(wt.size());
      for (size_t i = 0; i < wt.size(); ++i) h[i] = f32_to_f16_bits(wt[i]);
      w.add(lin.prefix + ".weight", DType::F16, {lin.out, lin.in}, h);
    } else {
      w.add(lin.prefix + ".weight", DType::F32, {lin.out, lin.in}, wt);
    }
    for (const char* s : {".trellis", ".suh", ".svh", ".su", ".sv", ".mul1", ".mcg", ".bias"})
      replaced.push_back(lin.prefix + s);
    ++n_linears;
  }
  std::sort(replaced.begin(), replaced.end());
  for (const TensorInfo* tp : ck->tensors()) {
    const TensorInfo& t = *tp;
    if (std::binary_search(replaced.begin(), replaced.end(), t.name)) continue;
    if (o.widen_others && (t.dtype == DType::BF16 || t.dtype == DType::F32)) add_widened(w, t);
    else w.add(t.name, t.dtype, t.shape, t.data, t.nbytes);
  }
  std::filesystem::create_directories(out);
  std::filesystem::copy_file(src + "/config.json", out + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  w.write(out + "/model.safetensors");
  return n_linears;
}

}  // namespace dsv41::test
