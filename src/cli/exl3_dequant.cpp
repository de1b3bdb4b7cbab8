// `dsv41-serve exl3-dequant --in FILE.safetensors --prefix P --out OUT.safetensors`: decodes one
// EXL3 linear (EXL3.md §2.6, §3.1) into `w_hat` (f16 [k,n], bit-exact exllamav3 `reconstruct`) and
// `w_full` (f32 [k,n], the effective weight of y = x . W).
#include <memory>
#include <string>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/exl3/decoder.h"
#include "dsv41/exl3/exl3_tensors.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::cli {

namespace {

struct DequantOptions {
  std::string in, prefix, out;
};

int run_exl3_dequant(const DequantOptions& o) {
  auto file = SafetensorsFile::open(o.in);
  const exl3::TensorLookup find = [&](const std::string& name) { return file->find(name); };
  if (!exl3::has_exl3_tensors(find, o.prefix)) fail("{}: no tensor {}.trellis (not an EXL3 linear)", o.in, o.prefix);
  const exl3::Exl3Tensors t = exl3::read_exl3_tensors(find, o.prefix, o.in);
  std::vector<uint16_t> w_hat(static_cast<size_t>(t.k * t.n));
  exl3::reconstruct_f16(t.trellis, t.k, t.n, t.K, t.codebook, w_hat.data());
  const std::vector<float> w_full = exl3::full_weight_f32(t.view());
  SafetensorsWriter w;
  w.add("w_hat", DType::F16, {t.k, t.n}, w_hat);
  w.add("w_full", DType::F32, {t.k, t.n}, w_full);
  w.set_metadata("source", o.in);
  w.set_metadata("prefix", o.prefix);
  w.set_metadata("K", std::to_string(t.K));
  w.set_metadata("codebook", std::string(exl3::codebook_name(t.codebook)));
  w.write(o.out);
  fmt::print("{}: k={} n={} K={} codebook={}{} -> {}\n", o.prefix, t.k, t.n, t.K, exl3::codebook_name(t.codebook),
             t.legacy_signs ? " (legacy su/sv signs)" : "", o.out);
  return 0;
}

}  // namespace

Command add_exl3_dequant(CLI::App& root) {
  auto o = std::make_shared<DequantOptions>();
  CLI::App* app = root.add_subcommand("exl3-dequant", "Decode one EXL3 linear to w_hat (f16) and w_full (f32)");
  app->add_option("--in", o->in, "safetensors file holding the EXL3 tensors")->required();
  app->add_option("--prefix", o->prefix, "tensor name prefix P (reads P.trellis, P.suh, P.svh, P.mul1|P.mcg)")
      ->required();
  app->add_option("--out", o->out, "output safetensors file (w_hat, w_full)")->required();
  return Command{app, [o] { return run_exl3_dequant(*o); }};
}

}  // namespace dsv41::cli
