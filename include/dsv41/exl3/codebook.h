// EXL3 codebooks (EXL3.md §2.5): a 16-bit trellis state maps to one fp16 weight value. The three
// codebooks differ only in this map; the per-tensor marker tensor (`mul1` / `mcg` / none) picks one.
#pragma once
#include <cstdint>
#include <string_view>

namespace dsv41::exl3 {

// Numbering follows upstream's `cb` index (0 = 3INST, 1 = MCG, 2 = MUL1).
enum class Codebook : uint8_t { k3Inst = 0, kMcg = 1, kMul1 = 2 };

// Marker values as stored (I32 scalars `<prefix>.mul1` / `<prefix>.mcg`).
constexpr uint32_t kMul1Multiplier = 0x83DCD12Du;  // == int32 -2082680531
constexpr uint32_t kMcgMultiplier = 0xCBAC1FEDu;   // == int32 -877912083

std::string_view codebook_name(Codebook cb);  // "3inst", "mcg", "mul1"
// Parses "3inst" | "mcg" | "mul1" (throws dsv41::Error otherwise).
Codebook codebook_from_name(std::string_view name);

// The exact fp16 value (bit pattern) of one 16-bit state, computed from the formula (no table).
uint16_t decode_state_f16(Codebook cb, uint32_t state);

// The 65536-entry table of decode_state_f16, indexed by state; built once, thread-safe, never freed.
const uint16_t* codebook_lut_f16(Codebook cb);
// The same table widened to fp32 (exact).
const float* codebook_lut_f32(Codebook cb);

}  // namespace dsv41::exl3
