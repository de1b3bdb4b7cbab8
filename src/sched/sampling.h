// Sampling on the engine side: penalties, temperature, top-k, top-p, min-p, seeded RNG, logprobs.
// One Sampler per sequence: it owns the sequence's RNG so that the same seed and the same request
// give the same tokens whatever else is batched alongside (and across preemption).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dsv41::sched {

struct SamplingParams {
  double temperature = 1.0;  // < 1e-5 = greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // <= 0 = off
  double min_p = 0.0;        // [0, 1]
  double repetition_penalty = 1.0;  // > 0; 1 = off (applies to prompt and output tokens)
  double presence_penalty = 0.0;    // [-2, 2], output tokens only
  double frequency_penalty = 0.0;   // [-2, 2], output tokens only
  std::unordered_map<int32_t, float> logit_bias;
  bool has_seed = false;
  uint64_t seed = 0;
  int top_logprobs = -1;  // -1: no logprobs; 0..20: chosen token's logprob plus that many alternatives
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;                              // log-softmax of the raw logits
  std::vector<std::pair<int32_t, float>> top;        // best raw logprobs, descending
};

class Sampler {
 public:
  Sampler(const SamplingParams& p, std::span<const int32_t> prompt);
  // Picks the next token from one row of raw logits. `banned` ids are never chosen (EOS while
  // below min_tokens). Records the token for the penalties.
  SampledToken sample(std::span<const float> logits, std::span<const int32_t> banned = {});
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> prompt_ids_;  // distinct prompt ids, for repetition_penalty
  std::vector<float> work_;
  std::vector<int32_t> order_;
};

}  // namespace dsv41::sched
