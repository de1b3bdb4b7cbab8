// Scoped overrides of a GEMM's process-wide test hooks (ops::gpu::raw::set_*_min_rows and
// set_*_tile): the GEMM tests force the dispatch threshold and CTA tile for one case and must leave
// the previous values behind for the next one, also when an assertion ends the case early.
#pragma once
#include <cstdint>

namespace dsv41::test {

// SetMinRows and SetTile each install a new value and return the one they replaced.
template <int64_t (*SetMinRows)(int64_t), int (*SetTile)(int)>
class ScopedGemmDispatch {
 public:
  ScopedGemmDispatch(int64_t min_rows, int tile) : rows_(SetMinRows(min_rows)), tile_(SetTile(tile)) {}
  ~ScopedGemmDispatch() {
    SetMinRows(rows_);
    SetTile(tile_);
  }
  ScopedGemmDispatch(const ScopedGemmDispatch&) = delete;
  ScopedGemmDispatch& operator=(const ScopedGemmDispatch&) = delete;

 private:
  int64_t rows_;
  int tile_;
};

}  // namespace dsv41::test
