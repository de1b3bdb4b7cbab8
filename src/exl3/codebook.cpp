#include "dsv41/exl3/codebook.h"

#include <array>
#include <bit>
#include <mutex>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"

namespace dsv41::exl3 {

std::string_view codebook_name(Codebook cb) {
  switch (cb) {
    case Codebook::k3Inst: return "3inst";
    case Codebook::kMcg: return "mcg";
    case Codebook::kMul1: return "mul1";
  }
  return "?";
}

Codebook codebook_from_name(std::string_view name) {
  if (name == "3inst") return Codebook::k3Inst;
  if (name == "mcg") return Codebook::kMcg;
  if (name == "mul1") return Codebook::kMul1;
  fail("unknown EXL3 codebook '{}' (expected mul1, mcg or 3inst)", name);
}

namespace {

// 3INST / MCG: after the mask and xor both halves are fp16 numbers in [1/8, 2) in magnitude, so
// their exact sum fits in fp32; one RNE conversion to fp16 reproduces the GPU's __hadd.
uint16_t decode_lop3(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  const float lo = f16_bits_to_f32(static_cast<uint16_t>(x & 0xFFFFu));
  const float hi = f16_bits_to_f32(static_cast<uint16_t>(x >> 16));
  return f32_to_f16_bits(lo + hi);
}

// MUL1: h = 1024 + bytesum; h * f16(0x1EEE) + f16(0xC931) is a multiple of 2^-18 below 2^2 in
// magnitude, hence exact in fp32; one RNE conversion reproduces the fused __hfma.
uint16_t decode_mul1(uint32_t x) {
  const uint32_t b = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
  const float h = 1024.0f + static_cast<float>(b);
  const float k_inv = f16_bits_to_f32(0x1EEE);
  const float k_bias = f16_bits_to_f32(0xC931);
  return f32_to_f16_bits(h * k_inv + k_bias);
}

struct Tables {
  std::vector<uint16_t> f16;
  std::vector<float> f32;
};

const Tables& tables(Codebook cb) {
  static std::array<Tables, 3> all;
  static std::array<std::once_flag, 3> once;
  const auto i = static_cast<size_t>(cb);
  std::call_once(once[i], [&] {
    Tables& t = all[i];
    t.f16.resize(65536);
    t.f32.resize(65536);
    for (uint32_t s = 0; s < 65536; ++s) {
      t.f16[s] = decode_state_f16(cb, s);
      t.f32[s] = f16_bits_to_f32(t.f16[s]);
    }
  });
  return all[i];
}

}  // namespace

uint16_t decode_state_f16(Codebook cb, uint32_t state) {
  state &= 0xFFFFu;
  switch (cb) {
    case Codebook::k3Inst: return decode_lop3(state * 89226354u + 64248484u);
    case Codebook::kMcg: return decode_lop3(state * kMcgMultiplier);
    case Codebook::kMul1: return decode_mul1(state * kMul1Multiplier);
  }
  DSV_ASSERT(false, "bad codebook {}", static_cast<int>(cb));
  return 0;
}

const uint16_t* codebook_lut_f16(Codebook cb) { return tables(cb).f16.data(); }
const float* codebook_lut_f32(Codebook cb) { return tables(cb).f32.data(); }

}  // namespace dsv41::exl3
