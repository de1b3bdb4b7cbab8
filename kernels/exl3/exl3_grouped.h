// Grouped EXL3 linears: many matrices (a MoE layer's experts) over their own row ranges in a
// handful of launches, for passes where each expert takes tens of rows (prefill).
//
// The rows are sorted by matrix (all rows of expert 0, then expert 1, ...). Two kernels:
//   input: x_had = H128(x ⊙ suh) / sqrt(128) in fp16 for every (set, sorted row), with that row's
//          matrix's suh; the source row is gathered (src_row), so the caller never copies x.
//   gemm:  one block per (tile, 128-column group); a tile is up to 64 consecutive sorted rows of one
//          matrix, and the block runs the whole k range (no k-split: at these row counts the
//          split partials would outweigh the weights), then the output Hadamard, svh, bias, an
//          optional bf16 rounding, and writes each row to its output row (out_row: a scatter).
// A gemm launch takes the tiles of one (bits, codebook, row class) (the kernel is specialised on
// all three; row class H: tiles of up to 16H rows, whose blocks run H 16-row mma slices and take
// fewer registers the smaller H is); callers sort tiles by class, best the smallest that holds a
// tile (grouped_row_class), so that no slice is empty. "Sets" are parallel matrix arrays over the
// same rows (a MoE's gate and up projections): a tile names its set. Sums run in a fixed order, so results are bitwise
// repeatable and independent of how the tiles are grouped into launches.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "exl3/exl3_gemm.h"

namespace dsv41::exl3::cuda {

constexpr int kGroupedSets = 2;

struct GroupedTile {
  int32_t set;     // which matrix array / x_had / output
  int32_t matrix;  // index into that array
  int32_t row0;    // first sorted row
  int32_t rows;    // 1..kLargeRows
};

struct GroupedInputParams {
  const void* x = nullptr;  // [*][x_stride], x_cols valid values per row (zero-extended to k)
  ActType x_type = ActType::F32;
  int64_t x_stride = 0, x_cols = 0;
  const int32_t* src_row = nullptr;    // device [rows]: x row of each sorted row; nullptr = the same row
  const int32_t* matrix_of = nullptr;  // device [rows]: matrix index of each sorted row
  const Exl3Matrix* mats[kGroupedSets] = {};  // device arrays (first `sets` used)
  int sets = 1;
  int k = 0;  // padded k of every matrix
  int64_t rows = 0;
  __half* xh[kGroupedSets] = {};  // device [rows][k] per set
};

struct GroupedGemmParams {
  const Exl3Matrix* mats[kGroupedSets] = {};  // device arrays
  const GroupedTile* tiles = nullptr;         // device [ntiles], every tile's matrix of this class
  int ntiles = 0;
  int bits = 0, codebook = 0;  // the class
  int row_class = 4;           // H: every tile has at most 16H rows
  int k = 0, n = 0;            // padded shapes of every matrix
  const __half* xh[kGroupedSets] = {};  // device [rows][k] per set (exl3_grouped_input)
  float* y[kGroupedSets] = {};          // device [*][y_stride] per set, y_cols columns written
  int64_t y_stride = 0, y_cols = 0;
  const int32_t* out_row = nullptr;  // device [rows]: output row of each sorted row; nullptr = the same row
  bool round_bf16 = false;           // round each output to a bf16 value (stored as fp32)
};

// The smallest row class that holds a tile of `rows` rows (1..kLargeRows).
inline int grouped_row_class(int rows) { return (rows + 15) / 16; }

cudaError_t launch_grouped_input(const GroupedInputParams& p, cudaStream_t stream);
cudaError_t launch_grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream);

}  // namespace dsv41::exl3::cuda
