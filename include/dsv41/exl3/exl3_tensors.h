// Reading and validating the stored tensors of one EXL3 linear (EXL3.md §1.3), independent of
// where they come from (a Checkpoint, a single safetensors file, a test's in-memory file).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv41/exl3/codebook.h"
#include "dsv41/exl3/decoder.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::exl3 {

// Returns the tensor with that exact name, or nullptr.
using TensorLookup = std::function<const TensorInfo*(const std::string& name)>;

// One EXL3 linear's storage. The trellis is normally not copied: `trellis` then points into the
// mapped file, which must outlive this object; misaligned or synthesized trellises live in
// `owned_trellis`. suh/svh/bias are widened to fp32 copies (small).
struct Exl3Tensors {
  std::string prefix;
  int64_t k = 0;  // padded in_features
  int64_t n = 0;  // padded out_features
  int K = 0;
  Codebook codebook = Codebook::k3Inst;
  bool legacy_signs = false;  // su/sv packed sign bits instead of suh/svh
  const uint16_t* trellis = nullptr;
  std::vector<uint16_t> owned_trellis;
  std::vector<float> suh;   // [k]
  std::vector<float> svh;   // [n]
  std::vector<float> bias;  // [n] (zero-padded) or empty

  Exl3Tensors() = default;
  Exl3Tensors(Exl3Tensors&& o) noexcept;
  Exl3Tensors& operator=(Exl3Tensors&& o) noexcept;
  Exl3Tensors(const Exl3Tensors&) = delete;
  Exl3Tensors& operator=(const Exl3Tensors&) = delete;

  Exl3View view() const;
  uint64_t trellis_bytes() const { return static_cast<uint64_t>(k) * static_cast<uint64_t>(n) * K / 8; }
  // Bytes as stored: trellis + fp16 suh/svh (+ fp16 bias).
  uint64_t stored_bytes() const;
};

// True when `<prefix>.trellis` exists.
bool has_exl3_tensors(const TensorLookup& find, const std::string& prefix);

// Reads `<prefix>.{trellis, suh, svh | su, sv, mul1 | mcg, bias}` and validates dtypes, shapes,
// K (1..8), the 128-padding of k and n, marker values and finiteness of the scales. `where` names
// the source (file or folder) in error messages.
Exl3Tensors read_exl3_tensors(const TensorLookup& find, const std::string& prefix, const std::string& where);

// Unpacks legacy sign words (bit i of word j -> element 16j+i; set = -1).
std::vector<float> unpack_sign_bits(const uint16_t* words, int64_t count);

}  // namespace dsv41::exl3
