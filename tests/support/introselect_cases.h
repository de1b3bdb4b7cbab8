// Inputs (values, k) on which libstdc++'s introselect runs out of its 2·floor(log2 n) partition
// rounds and finishes with a heap select (found by search against an instrumented replay). The
// CPU replay (tests/model/topk_test.cpp) checks them against the library, the GPU replay
// (tests/gpu_ops/topk_replay_test.cpp) against the CPU replay.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace dsv41::test {

inline const std::vector<std::pair<std::vector<float>, int64_t>>& introselect_depth_limit_cases() {
  static const std::vector<std::pair<std::vector<float>, int64_t>> cases = {
      {{0, 3, 6, 12, 12, 5, 2, 7, 0, 9, 8, 12, 12, 13, 12, 15, 0, 2, 6, 9, 8, 5, 6, 12, 8, 9, 8, 1, 0, 7, 14}, 13},
      {{0, 2, 4, 9, 12, 5, 6, 21, 8, 14, 8, 11, 14, 4, 20, 16, 20, 12, 18, 13, 14, 20,
        0, 2, 2, 9, 4, 5, 18, 7, 8, 9, 8, 11, 14, 13, 12, 16, 16, 17, 6, 19, 20},
       26},
  };
  return cases;
}

}  // namespace dsv41::test
