// Compares a checkpoint with its manifest (see dsv41/loader/manifest.h). Every tensor of the
// checkpoint is accounted for exactly once: either it matches a manifest entry or it is reported
// as unexpected.
#include <cstring>
#include <unordered_set>

#include "dsv41/common/error.h"
#include "dsv41/loader/checkpoint.h"
#include "loader/manifest_build.h"

namespace dsv41 {

using manifest_detail::Exl3Linear;
using manifest_detail::Manifest;
using manifest_detail::pad128;

namespace {

class Checker {
 public:
  Checker(const Checkpoint& ckpt, std::vector<std::string>& out, std::unordered_set<std::string> plain_names)
      : ckpt_(ckpt), out_(out), plain_names_(std::move(plain_names)) {}

  // Looks a tensor up and marks it as accounted for.
  const TensorInfo* take(const std::string& name) {
    const TensorInfo* t = ckpt_.find(name);
    if (t) used_.insert(name);
    return t;
  }

  template <class... Args>
  void problem(fmt::format_string<Args...> f, Args&&... args) {
    out_.push_back(fmt::format(f, std::forward<Args>(args)...));
  }

  void plain(const TensorSpec& s, bool optional) {
    const TensorInfo* t = take(s.name);
    if (!t) {
      if (!optional) problem("missing tensor '{}' (expected {} {})", s.name, dtype_name(s.dtype), shape_str(s.shape));
      return;
    }
    dtype_is(*t, s.dtype, s.alt_dtypes);
    shape_is(*t, s.shape);
  }

  bool dtype_is(const TensorInfo& t, DType want, const std::vector<DType>& alts = {}) {
    if (t.dtype == want) return true;
    for (DType a : alts)
      if (t.dtype == a) return true;
    std::string expect(dtype_name(want));
    for (DType a : alts) expect += " or " + std::string(dtype_name(a));
    problem("tensor '{}': dtype {}, expected {}", t.name, dtype_name(t.dtype), expect);
    return false;
  }

  bool shape_is(const TensorInfo& t, const std::vector<int64_t>& want) {
    if (t.shape == want) return true;
    problem("tensor '{}': shape {}, expected {}", t.name, t.shape_str(), shape_str(want));
    return false;
  }

  // An EXL3-format linear: either EXL3 tensors (EXL3.md §1.3) or an unquantized weight.
  void exl3_linear(const Exl3Linear& L) {
    const std::string& P = L.prefix;
    const bool has_trellis = ckpt_.find(P + ".trellis") != nullptr;
    const bool has_weight = ckpt_.find(P + ".weight") != nullptr;
    if (!has_trellis && !has_weight) {
      if (!L.optional)
        problem("missing tensor '{}.trellis' (EXL3 linear '{}', {} -> {}: neither {}.trellis nor {}.weight is present)", P,
                P, L.in, L.out, P, P);
      return;
    }
    if (has_trellis && has_weight)
      problem("EXL3 linear '{}': both {}.trellis and {}.weight are present", P, P, P);
    if (!has_trellis) {
      const TensorInfo* w = take(P + ".weight");
      if (dtype_is(*w, DType::F16, {DType::BF16, DType::F32})) shape_is(*w, {L.out, L.in});
      if (L.bias)
        if (const TensorInfo* b = take(P + ".bias"))
          if (dtype_is(*b, DType::F16, {DType::BF16, DType::F32})) shape_is(*b, {L.out});
      return;
    }
    const int64_t k = pad128(L.in), n = pad128(L.out);
    const TensorInfo* tr = take(P + ".trellis");
    if (dtype_is(*tr, DType::I16)) {
      if (tr->shape.size() != 3 || tr->shape[0] != k / 16 || tr->shape[1] != n / 16) {
        problem("EXL3 linear '{}': trellis shape {}, expected [{}, {}, 16*K] (in {} and out {} padded to 128)", P,
                tr->shape_str(), k / 16, n / 16, L.in, L.out);
      } else if (tr->shape[2] % 16 != 0 || tr->shape[2] / 16 < 1 || tr->shape[2] / 16 > 8) {
        problem("EXL3 linear '{}': trellis last dim {} is not 16*K with K in 1..8", P, tr->shape[2]);
      }
    }
    // Scale vectors: suh/svh (F16), or the legacy packed sign bits su/sv (I16, one bit per element).
    const TensorInfo* suh = take(P + ".suh");
    const TensorInfo* svh = take(P + ".svh");
    const TensorInfo* su = take(P + ".su");
    const TensorInfo* sv = take(P + ".sv");
    if (suh) {
      if (dtype_is(*suh, DType::F16) && suh->shape != std::vector<int64_t>{k})
        problem("EXL3 linear '{}': suh shape {}, expected [{}] to match the trellis (k = {})", P, suh->shape_str(), k, k);
    } else if (su) {
      if (dtype_is(*su, DType::I16)) shape_is(*su, {k / 16});
    } else {
      problem("missing tensor '{}.suh' (EXL3 linear '{}' has a trellis)", P, P);
    }
    if (svh) {
      if (dtype_is(*svh, DType::F16) && svh->shape != std::vector<int64_t>{n})
        problem("EXL3 linear '{}': svh shape {}, expected [{}] to match the trellis (n = {})", P, svh->shape_str(), n, n);
    } else if (sv) {
      if (dtype_is(*sv, DType::I16)) shape_is(*sv, {n / 16});
    } else {
      problem("missing tensor '{}.svh' (EXL3 linear '{}' has a trellis)", P, P);
    }
    if (suh && su) problem("EXL3 linear '{}': both suh and legacy su are present", P);
    if (svh && sv) problem("EXL3 linear '{}': both svh and legacy sv are present", P);
    // Codebook marker: exactly one of mul1/mcg, or none (3INST), holding its constant.
    const TensorInfo* mul1 = take(P + ".mul1");
    const TensorInfo* mcg = take(P + ".mcg");
    if (mul1 && mcg) problem("EXL3 linear '{}': both codebook markers mul1 and mcg are present", P);
    marker(P, mul1, "mul1", kExl3Mul1Marker);
    marker(P, mcg, "mcg", kExl3McgMarker);
    // EXL3 biases are optional, F16, padded to n; `ffn.gate.bias` is the router's own tensor.
    if (L.bias || !plain_names_.count(P + ".bias"))
      if (const TensorInfo* b = take(P + ".bias"))
        if (dtype_is(*b, DType::F16)) shape_is(*b, {n});
  }

  void marker(const std::string& P, const TensorInfo* t, const char* which, int32_t expect) {
    if (!t) return;
    if (!dtype_is(*t, DType::I32) || !shape_is(*t, {})) return;
    if (t->data == nullptr) return;  // header-only parse: nothing to compare
    int32_t v = 0;
    std::memcpy(&v, t->data, sizeof v);
    if (v != expect) problem("EXL3 linear '{}': {}.{} holds {}, expected {}", P, P, which, v, expect);
  }

  void unexpected() {
    for (const TensorInfo* t : ckpt_.tensors())
      if (!used_.count(t->name)) problem("unexpected tensor '{}' in {}", t->name, t->file);
  }

 private:
  const Checkpoint& ckpt_;
  std::vector<std::string>& out_;
  std::unordered_set<std::string> plain_names_;  // manifest tensors that belong to no linear
  std::unordered_set<std::string> used_;
};

}  // namespace

std::vector<std::string> check_checkpoint(const ModelConfig& cfg, CheckpointFormat fmt, const Checkpoint& ckpt,
                                          const CheckOptions& opt) {
  const Manifest m = manifest_detail::build_manifest(cfg, fmt, Exl3Plan{});
  std::vector<std::string> out;
  std::unordered_set<std::string> plain;
  for (size_t i = 0; i < m.tensors.size(); ++i)
    if (m.linear_of[i] < 0) plain.insert(m.tensors[i].name);
  Checker ck(ckpt, out, std::move(plain));
  std::vector<bool> linear_done(m.linears.size(), false);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const int lin = m.linear_of[i];
    if (lin >= 0) {
      // the planned tensors of a linear are checked together, whatever form the file chose
      if (!linear_done[static_cast<size_t>(lin)]) ck.exl3_linear(m.linears[static_cast<size_t>(lin)]);
      linear_done[static_cast<size_t>(lin)] = true;
      continue;
    }
    const TensorSpec& s = m.tensors[i];
    const bool optional = s.optional || (opt.engram_tables_external && manifest_detail::is_engram_table(s.name));
    ck.plain(s, optional);
  }
  ck.unexpected();
  return out;
}

}  // namespace dsv41
