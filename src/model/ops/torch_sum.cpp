#include "model/ops/torch_sum.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <vector>

namespace dsv41::model {
namespace {
int64_t ceil_log2(int64_t x) {
  if (x <= 1) return 0;
  return 64 - std::countl_zero(static_cast<uint64_t>(x - 1));
}
}  // namespace

float torch_sum_f32(const float* x, int64_t n, int lanes) {
  constexpr int kIlp = 4, kLevels = 4, kMaxLanes = 16;
  const int64_t vec_size = n / lanes, size_ilp = vec_size / kIlp;
  float acc[kLevels][kIlp][kMaxLanes] = {};
  auto add_vec = [&](float* dst, int64_t v) {
    for (int l = 0; l < lanes; ++l) dst[l] += x[v * lanes + l];
  };
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size_ilp) / kLevels);
  const int64_t level_step = int64_t{1} << level_power, level_mask = level_step - 1;
  int64_t i = 0;
  while (i + level_step <= size_ilp) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < kIlp; ++k) add_vec(acc[0][k], i * kIlp + k);
    for (int lev = 1; lev < kLevels; ++lev) {
      for (int k = 0; k < kIlp; ++k)
        for (int l = 0; l < lanes; ++l) {
          acc[lev][k][l] += acc[lev - 1][k][l];
          acc[lev - 1][k][l] = 0.0f;
        }
      if ((i & (level_mask << (lev * level_power))) != 0) break;
    }
  }
  for (; i < size_ilp; ++i)
    for (int k = 0; k < kIlp; ++k) add_vec(acc[0][k], i * kIlp + k);
  for (int lev = 1; lev < kLevels; ++lev)
    for (int k = 0; k < kIlp; ++k)
      for (int l = 0; l < lanes; ++l) acc[0][k][l] += acc[lev][k][l];
  for (int64_t v = size_ilp * kIlp; v < vec_size; ++v) add_vec(acc[0][0], v);
  for (int k = 1; k < kIlp; ++k)
    for (int l = 0; l < lanes; ++l) acc[0][0][l] += acc[0][k][l];
  float total = 0.0f;
  for (int64_t k = vec_size * lanes; k < n; ++k) total += x[k];
  for (int l = 0; l < lanes; ++l) total += acc[0][0][l];
  return total;
}

float torch_mean_sq_f32(const float* x, int64_t n, int lanes) {
  std::vector<float> sq(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sq[i] = x[i] * x[i];
  return torch_sum_f32(sq.data(), n, lanes) / static_cast<float>(n);
}

}  // namespace dsv41::model
