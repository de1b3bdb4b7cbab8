// Tensor-parallel building blocks for the CPU engine, all exact (TP=N results equal TP=1 bit for
// bit, docs/TENSOR_PARALLEL.md):
//  - gather_columns: every rank holds [rows][width_r] of a row-major matrix; all ranks receive
//    [rows][sum width] with the ranks' column blocks side by side in rank order.
//  - ColumnParallelLinear: a rank computes its share of the outputs (a row slice of W), the ranks
//    all-gather them. Each output is the full-K dot product of the unsplit linear, so no partial
//    sums ever meet (unlike a row-parallel all-reduce, whose fp32 sum order would differ).
// "bf16 wire": values already rounded to bf16 travel as 2 bytes (exact; halves the bytes).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dsv41/dist/collective.h"
#include "dsv41/model/linear.h"

namespace dsv41::dist {

// widths[r] columns on rank r; `local` is this rank's [rows][widths[rank]]. bf16_wire: the values
// are bf16-rounded (checked in debug builds is too costly; callers guarantee it by construction).
void gather_columns(Collective& comm, const float* local, int64_t rows, std::span<const int64_t> widths, float* out,
                    bool bf16_wire);

// Widths of an aligned even split of `total` over the world (split_range per rank).
std::vector<int64_t> split_widths(int64_t total, int world, int64_t align);

class ColumnParallelLinear final : public Linear {
 public:
  // `local` computes outputs [split_range(out, rank, world, align)] of the full [out, in] linear.
  // bf16_wire: callers round this linear's outputs to bf16 (linear_bf16), so the rank rounds
  // before sending; rounding twice is the same as once.
  ColumnParallelLinear(std::unique_ptr<Linear> local, int64_t out_features, int64_t align, Collective* comm,
                       bool bf16_wire);
  int64_t in_features() const override { return local_->in_features(); }
  int64_t out_features() const override { return out_; }
  uint64_t weight_bytes() const override { return local_->weight_bytes(); }
  void forward(const float* x, int64_t m, float* y) const override;

 private:
  std::unique_ptr<Linear> local_;
  int64_t out_;
  std::vector<int64_t> widths_;
  Collective* comm_;
  bool bf16_wire_;
};

}  // namespace dsv41::dist
