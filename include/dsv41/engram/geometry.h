// Engram table geometry (MODEL.md §3.1, §3.5) and its tensor-parallel split.
//
// A table row is `head_dim` F8_E4M3 bytes followed by ceil(head_dim/32) F8_E8M0 scale bytes
// (256 + 8 = 264 bytes for the released config). The rows of one Engram layer are the hash
// columns' prime-sized blocks back to back (column = (n-2)·n_heads + head), so every column is a
// contiguous row range.
//
// Tensor-parallel split (docs/ENGRAM.md): rank r of N owns whole hash columns
// [floor(r·C/N), floor((r+1)·C/N)), i.e. one contiguous row range per table. Every token needs
// exactly one row per column, so each rank reads exactly its columns' rows (perfect balance) and
// the ranks all-gather the rows (no sums: results are bit-identical to one rank). The packer and
// every reader use engram_share() so the two can never disagree.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41::engram {

struct EngramGeometry {
  std::vector<int64_t> layer_ids;                    // engram_layer_ids
  std::vector<int64_t> rows;                         // per Engram layer: engram_num_embeddings
  std::vector<std::vector<int64_t>> column_offsets;  // per layer: n_columns+1 entries, back is rows
  int64_t head_dim = 0;     // e4m3 bytes per row
  int64_t scale_bytes = 0;  // e8m0 bytes per row: ceil(head_dim / 32)
  int64_t row_bytes = 0;    // head_dim + scale_bytes

  int64_t n_layers() const { return static_cast<int64_t>(layer_ids.size()); }
  int64_t n_columns() const;
  // Throws dsv41::Error when the Engram fields are inconsistent (primes not summing to
  // engram_num_embeddings, non-positive head_dim, ...).
  static EngramGeometry from_config(const ModelConfig& c);
  // Stable text naming everything a packed file depends on ("rows=660,864 head_dim=32 ...").
  std::string fingerprint() const;
};

// The part of one Engram layer's table that a rank owns.
struct EngramShare {
  int64_t col_begin = 0, col_end = 0;  // hash columns [col_begin, col_end)
  int64_t row_begin = 0, row_end = 0;  // table rows [row_begin, row_end)
  int64_t n_rows() const { return row_end - row_begin; }
  bool contains(int64_t row) const { return row >= row_begin && row < row_end; }
};

// Share of `rank` in `world` for Engram layer `layer` (position in engram_layer_ids). Ranks beyond
// the number of columns own nothing (an empty share). Throws on a bad rank/world/layer.
EngramShare engram_share(const EngramGeometry& g, int64_t layer, int rank, int world);
// Rank owning `row` of Engram layer `layer`.
int engram_row_owner(const EngramGeometry& g, int64_t layer, int64_t row, int world);

}  // namespace dsv41::engram
