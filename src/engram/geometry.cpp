#include "dsv41/engram/geometry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dsv41/common/error.h"

namespace dsv41::engram {

int64_t EngramGeometry::n_columns() const {
  return column_offsets.empty() ? 0 : static_cast<int64_t>(column_offsets.front().size()) - 1;
}

EngramGeometry EngramGeometry::from_config(const ModelConfig& c) {
  EngramGeometry g;
  if (c.engram_layer_ids.empty()) return g;
  DSV_CHECK(c.engram_num_embeddings.size() == c.engram_layer_ids.size(),
            "config: engram_num_embeddings has {} entries but engram_layer_ids has {}",
            c.engram_num_embeddings.size(), c.engram_layer_ids.size());
  DSV_CHECK(c.engram_head_dim > 0 && c.engram_head_dim <= (1 << 16),
            "config: engram_head_dim = {} is out of range", c.engram_head_dim);
  g.layer_ids = c.engram_layer_ids;
  g.rows = c.engram_num_embeddings;
  g.head_dim = c.engram_head_dim;
  g.scale_bytes = (c.engram_head_dim + 31) / 32;  // one E8M0 scale per 32 columns (MODEL.md §3.1)
  g.row_bytes = g.head_dim + g.scale_bytes;
  const auto primes = engram_column_primes(c);
  for (size_t l = 0; l < primes.size(); ++l) {
    std::vector<int64_t> off{0};
    for (int64_t p : primes[l]) off.push_back(off.back() + p);
    DSV_CHECK(off.back() == g.rows[l],
              "config: engram_num_embeddings[{}] = {} but the column primes of layer {} sum to {}", l, g.rows[l],
              g.layer_ids[l], off.back());
    g.column_offsets.push_back(std::move(off));
  }
  return g;
}

std::string EngramGeometry::fingerprint() const {
  return fmt::format("layers={} rows={} columns={} head_dim={} scale_bytes={}", fmt::join(layer_ids, ","),
                     fmt::join(rows, ","), n_columns(), head_dim, scale_bytes);
}

EngramShare engram_share(const EngramGeometry& g, int64_t layer, int rank, int world) {
  DSV_CHECK(world >= 1, "engram: world size {} must be at least 1", world);
  DSV_CHECK(rank >= 0 && rank < world, "engram: rank {} is outside world size {}", rank, world);
  DSV_CHECK(layer >= 0 && layer < g.n_layers(), "engram: layer index {} out of range ({} Engram layers)", layer,
            g.n_layers());
  const int64_t C = g.n_columns();
  EngramShare s;
  s.col_begin = rank * C / world;
  s.col_end = (rank + 1) * C / world;
  const auto& off = g.column_offsets[static_cast<size_t>(layer)];
  s.row_begin = off[static_cast<size_t>(s.col_begin)];
  s.row_end = off[static_cast<size_t>(s.col_end)];
  return s;
}

int engram_row_owner(const EngramGeometry& g, int64_t layer, int64_t row, int world) {
  DSV_CHECK(layer >= 0 && layer < g.n_layers(), "engram: layer index {} out of range", layer);
  DSV_CHECK(row >= 0 && row < g.rows[static_cast<size_t>(layer)], "engram: row {} out of range for layer {}", row,
            g.layer_ids[static_cast<size_t>(layer)]);
  for (int r = 0; r < world; ++r)
    if (engram_share(g, layer, r, world).contains(row)) return r;
  DSV_ASSERT(false, "row {} has no owner", row);
  return -1;
}

}  // namespace dsv41::engram
