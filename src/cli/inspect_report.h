// The numbers `dsv41-serve inspect` prints, computed from a list of tensors (the expected
// manifest or the tensors of a checkpoint): counts by component, EXL3 bit widths, and a per-rank
// memory estimate for tensor parallelism.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dsv41/common/dtype.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/manifest.h"

namespace dsv41::cli {

struct TensorRow {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

struct ComponentTotals {
  uint64_t tensors = 0;
  uint64_t parameters = 0;  // weight elements: scales/suh/svh/markers excluded, FP4 bytes count 2
  uint64_t bytes = 0;
};

struct Exl3Stats {
  uint64_t linears = 0;
  uint64_t weights = 0;         // k*n over all trellises (padded sizes)
  uint64_t storage_bytes = 0;   // trellis + suh + svh (+ legacy su/sv) bytes
  std::map<int, uint64_t> k_histogram;  // K -> number of linears
  double mean_k() const;        // weighted by weights
  double bits_per_weight() const;  // storage bits per weight, scale vectors included
  void add_trellis_bits(double bits) { trellis_bits_ += bits; }

 private:
  double trellis_bits_ = 0;
};

// Partition assumed for --world-size N (the reference's, model.py): routed experts split by
// expert id; attention query heads split (wq_b, wo_a groups, wo_b rows, attn_sink, indexer wq_b and
// weights_proj); embedding, head and the DSpark Markov tables split by vocabulary rows; Engram
// table rows split; everything else (wq_a, wkv, norms, mHC, compressors, indexer wk, routers,
// shared experts, Engram wkv, main_proj, confidence head) replicated on every rank.
struct RankEstimate {
  int rank = 0;
  uint64_t resident_bytes = 0;      // weights a rank keeps in memory, as stored
  uint64_t engram_table_bytes = 0;  // Engram rows this rank owns (file-backed, read on demand)
  uint64_t vision_bytes = 0;        // vision tower (the engine does not load it)
  std::array<uint64_t, kNumComponents> by_component{};
};

struct Report {
  uint64_t n_tensors = 0;
  uint64_t total_bytes = 0;
  uint64_t parameters = 0;
  std::array<ComponentTotals, kNumComponents> components{};
  Exl3Stats exl3;
  std::array<Exl3Stats, kNumComponents> exl3_by_component{};
  std::vector<RankEstimate> ranks;
};

std::vector<TensorRow> rows_from_manifest(const std::vector<TensorSpec>& specs);
uint64_t parameters_of(const TensorRow& t);
// `cfg` may be null (config unreadable): ranks then split only what the names reveal.
Report make_report(const std::vector<TensorRow>& rows, const ModelConfig* cfg, int world_size);

// A one-paragraph architecture summary (layer roles included), for the text report.
std::string architecture_summary(const ModelConfig& cfg);

}  // namespace dsv41::cli
