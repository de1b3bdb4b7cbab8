// Rotary position embedding (MODEL.md §4 RoPE): the last rope_dim values of a vector as adjacent
// (2i, 2i+1) pairs = complex numbers, multiplied by e^{i·p·f_i} in fp32 and written back as bf16.
#pragma once
#include <cstdint>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41::model {

class RopeTable {
 public:
  RopeTable() = default;
  // Frequencies f_i = 1/θ^(2i/d) (fp32, as the reference computes them); with yarn_original > 0
  // the YaRN blend between f_i and f_i/factor over the beta_fast..beta_slow correction band.
  RopeTable(int64_t rope_dim, double theta, int64_t yarn_original, double factor, double beta_fast,
            double beta_slow);
  // The table for a layer of the given compress ratio: plain θ = rope_theta for ratio 0, else
  // compress_rope_theta with YaRN when rope_scaling is yarn.
  static RopeTable for_ratio(const ModelConfig& c, int64_t ratio);

  int64_t rope_dim() const { return rope_dim_; }
  const std::vector<float>& freqs() const { return freqs_; }
  // Rotates v[0 .. rope_dim) (the caller passes the tail) at position p; inverse conjugates.
  void apply(float* v, int64_t p, bool inverse = false) const;

 private:
  int64_t rope_dim_ = 0;
  std::vector<float> freqs_;
};

}  // namespace dsv41::model
