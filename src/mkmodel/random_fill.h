// Deterministic random tensor contents for `mkmodel`. Every tensor is cut into fixed chunks of
// kFillChunk elements; each chunk has its own PRNG stream seeded from (seed, tensor name, chunk
// index), so the bytes never depend on the thread count or on the order chunks are produced in.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/common/dtype.h"
#include "dsv41/loader/manifest.h"

namespace dsv41::mkmodel {

constexpr int64_t kFillChunk = int64_t{1} << 20;  // elements per PRNG stream

// How the values of one tensor are drawn (see rule_for for the choices and why).
enum class FillKind : uint8_t {
  kConst,       // every element = mean
  kNormal,      // N(mean, std), written in the tensor's float dtype
  kRawBits,     // uniform random bytes (EXL3 trellis: any bit pattern is valid; FP4 nibbles)
  kE4m3Normal,  // e4m3 codes of N(0, std) (saturating at +-448)
  kE8m0,        // scale byte 127 + exponent + uniform jitter in [-jitter, +jitter]
  kSignedScale, // random sign * std * U(1 - jitter_frac, 1 + jitter_frac)   (EXL3 suh/svh)
  kMarker,      // I32 scalar
};

struct FillRule {
  FillKind kind = FillKind::kConst;
  DType dtype = DType::F32;
  float mean = 0.0f;
  float std = 0.0f;
  int exponent = 0;      // kE8m0
  int jitter = 0;        // kE8m0: +- exponent steps
  float jitter_frac = 0; // kSignedScale
  int32_t marker = 0;    // kMarker
};

// 64-bit hash of a tensor name mixed with the seed (FNV-1a, then splitmix64 finalizer).
uint64_t tensor_seed(const std::string& name, uint64_t seed);

// Writes elements [chunk*kFillChunk, min(numel, (chunk+1)*kFillChunk)) of the tensor into `out`
// (exactly that many elements of rule.dtype; for kRawBits the element is the dtype's byte width).
void fill_chunk(const FillRule& rule, uint64_t tseed, int64_t numel, int64_t chunk, uint8_t* out);

// Standard-normal quantile of (i + 0.5) / 65536 (the sampling table; exposed for tests).
float normal_quantile16(uint16_t i);

}  // namespace dsv41::mkmodel
