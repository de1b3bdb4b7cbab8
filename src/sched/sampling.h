// Sampling on the engine side: penalties, temperature, top-k, top-p, min-p, seeded RNG, logprobs.
// One Sampler per sequence: it owns the sequence's RNG so that the same seed and the same request
// give the same tokens whatever else is batched alongside (and across preemption).
//
// sample() = distribution() + one uniform() + TokenDistribution::pick() + record(). Speculative
// decoding (src/spec) uses the pieces separately: it needs the processed probabilities of both
// the target and the drafter rows, and commits several tokens per step.
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
  int64_t step = 0;  // the sequence's target step that committed it (set by the scheduler; 1 = first)
};

// The distribution one sampling step draws from, after every request transform: candidates
// (most likely first) with unnormalised weights; probability = weight / total. Greedy requests
// give a single candidate of weight 1.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0.0;
  double prob(int32_t id) const;
  // The candidate whose cumulative weight interval holds u·total (u in [0, 1)).
  int32_t pick(double u) const;
};

class Sampler {
 public:
  Sampler(const SamplingParams& p, std::span<const int32_t> prompt);
  // Picks the next token from one row of raw logits. `banned` ids are never chosen (EOS while
  // below min_tokens). Records the token for the penalties.
  SampledToken sample(std::span<const float> logits, std::span<const int32_t> banned = {});
  const SamplingParams& params() const { return p_; }
  bool greedy() const { return p_.temperature < 1e-5 || p_.top_k == 1; }
  // Greedy with nothing that edits or reports the row (no bias, penalties, bans or logprobs): the
  // pick is the raw row's first maximum (std::max_element), which a backend may compute where the
  // logits are (ForwardItem::greedy_id); record(id, {}) then commits it.
  bool raw_argmax(std::span<const int32_t> banned) const;

  // The distribution sample() would draw from for this row, without drawing or recording.
  // `pending` are tokens counted as already generated on top of the recorded ones (penalties of
  // a speculative draft position that follows earlier drafts).
  TokenDistribution distribution(std::span<const float> logits, std::span<const int32_t> banned = {},
                                 std::span<const int32_t> pending = {}) const;
  // Next uniform in [0, 1) from this sequence's RNG (53 bits of one engine output).
  double uniform();
  // Commits `id` (counted for the penalties) and fills its logprobs from the raw row.
  SampledToken record(int32_t id, std::span<const float> logits);

 private:
  // The candidates of one row after every request transform, as views into the calling thread's
  // scratch (valid until its next call): entries (candidate_sort.h) with their weights, most likely
  // first; or one candidate `only` (greedy, or everything banned).
  struct Weighted {
    std::span<const uint64_t> entries;
    std::span<const double> weights;
    double total = 1.0;
    int32_t only = -1;
  };
  Weighted weigh(std::span<const float> logits, std::span<const int32_t> banned,
                 std::span<const int32_t> pending) const;

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> prompt_ids_;  // distinct prompt ids, for repetition_penalty
};

}  // namespace dsv41::sched
