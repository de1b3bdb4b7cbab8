// Bit-exact CPU decoder for EXL3 trellis tensors (EXL3.md §2) and the fp32 reference linear of
// §3.1. This is the parity reference for the CUDA kernels: every function here is deterministic and
// independent of the thread count.
//
// Layouts used throughout:
//  - trellis: row-major [k/16][n/16][16*K] uint16 (the stored I16 tensor), one 16x16 tile per
//    16*K words; tile (tk, tn) covers input rows 16tk.. and output columns 16tn..
//  - W_hat / W_full: row-major [k][n] (input-major, y = x . W), as exllamav3's `reconstruct` writes.
//  - x: [m][k] rows; y: [m][n] rows.
#pragma once
#include <cstdint>
#include <vector>

#include "dsv41/exl3/codebook.h"

namespace dsv41::exl3 {

constexpr int kTile = 16;          // tile edge
constexpr int kTileValues = 256;   // values per tile
constexpr int kHadamardSize = 128; // Hadamard block and padding granularity

// Position j (0..255) of a tile's stream -> (row = input index, col = output index) in the tile
// (EXL3.md §2.4, tensor-core fragment order).
struct TilePos {
  uint8_t row;
  uint8_t col;
};
TilePos tile_position(int j);

// The 256 16-bit trellis states of one tile of 16*K words (EXL3.md §2.2–2.3), in stream order j.
void tile_states(const uint16_t* tile, int K, uint16_t states[kTileValues]);

// Decodes one tile into a row-major 16x16 block [row][col] (row = input, col = output).
void decode_tile_f16(const uint16_t* tile, int K, Codebook cb, uint16_t out[kTileValues]);
void decode_tile_f32(const uint16_t* tile, int K, Codebook cb, float out[kTileValues]);

// exllamav3's `reconstruct`: W_hat [k][n] fp16 bit patterns, bit-exact. k, n multiples of 16.
void reconstruct_f16(const uint16_t* trellis, int64_t k, int64_t n, int K, Codebook cb, uint16_t* w_hat);

// In-place orthonormal Sylvester Hadamard (natural order, scale 1/sqrt(128)) over consecutive
// 128-element blocks of `len` values (len a multiple of 128), in fp32.
void hadamard128(float* v, int64_t len);

// A decoded view of one EXL3 linear's storage. Pointers are not owned.
struct Exl3View {
  const uint16_t* trellis = nullptr;  // [k/16][n/16][16K]
  int64_t k = 0;                      // padded in_features (multiple of 128)
  int64_t n = 0;                      // padded out_features (multiple of 128)
  int K = 0;                          // bits per weight, 1..8
  Codebook codebook = Codebook::kMul1;
  const float* suh = nullptr;  // [k] (fp16 values widened)
  const float* svh = nullptr;  // [n]
  const float* bias = nullptr; // [n] or nullptr
};

// The effective weight W = diag(suh) . B_k . W_hat . B_n . diag(svh), [k][n] fp32 (EXL3.md §3.1),
// computed from the exact fp16 W_hat with fp32 Hadamards.
std::vector<float> full_weight_f32(const Exl3View& w);

// y[m][n] = x[m][k] . W + bias, fp32 throughout, through the Hadamard formulation
// ((x*suh) . B_k) . W_hat . B_n * svh (+ bias). The trellis is decoded tile by tile on the fly
// (never materialised); tiles are distributed over threads by output column, accumulation order is
// fixed (ascending k), so results do not depend on the thread count.
void exl3_matmul_f32(const Exl3View& w, const float* x, int64_t m, float* y);

}  // namespace dsv41::exl3
