#include "sched/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "dsv41/common/parallel.h"
#include "sched/candidate_sort.h"

namespace dsv41::sched {

Sampler::Sampler(const SamplingParams& p, std::span<const int32_t> prompt) : p_(p) {
  if (p_.has_seed) {
    rng_.seed(p_.seed);
  } else {
    std::random_device rd;
    rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  }
  if (p_.repetition_penalty != 1.0) {
    prompt_ids_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_ids_.begin(), prompt_ids_.end());
    prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
  }
}

namespace {

// Rows at least this long spread their exp() over the thread pool (each value is still computed
// by one thread, so the results do not depend on the split).
constexpr int64_t kParallelExpMin = 4096;

// Per-thread buffers of one row's processing, reused from token to token: fresh 0.5-1 MB vectors
// every token cost more in page faults than the arithmetic on them.
struct RowScratch {
  std::vector<float> work;     // processed logits
  std::vector<double> values;  // weights in candidate order, or log-sum-exp terms
};

RowScratch& row_scratch() {
  thread_local RowScratch s;
  return s;
}

// log-softmax value of every id is logit - lse; computed in double so that 129k-wide rows keep
// their small probabilities. The terms are summed in id order whatever the thread split.
double log_sum_exp(std::span<const float> x) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : x) m = std::max(m, v);
  if (!std::isfinite(m)) return m;
  std::vector<double>& terms = row_scratch().values;
  terms.resize(x.size());
  parallel_for(
      static_cast<int64_t>(x.size()),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) terms[i] = std::exp(static_cast<double>(x[static_cast<size_t>(i)]) - m);
      },
      kParallelExpMin);
  double s = 0.0;
  for (double t : terms) s += t;
  return m + std::log(s);
}

// The index of the candidate whose cumulative weight interval holds u·total: the first i with
// u·total < w[0] + ... + w[i] (summed in order), else the last one (rounding at the top end).
size_t pick_index(std::span<const double> w, double total, double u) {
  const double x = u * total;
  double c = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    c += w[i];
    if (x < c) return i;
  }
  return w.size() - 1;
}

}  // namespace

double TokenDistribution::prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return total > 0.0 ? weights[i] / total : 0.0;
  return 0.0;
}

int32_t TokenDistribution::pick(double u) const { return ids[pick_index(weights, total, u)]; }

Sampler::Weighted Sampler::weigh(std::span<const float> logits, std::span<const int32_t> banned,
                                 std::span<const int32_t> pending) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  Weighted out;

  // Output counts for the penalties: the recorded ones, plus `pending` (speculative positions).
  const std::unordered_map<int32_t, int32_t>* counts = &output_counts_;
  std::unordered_map<int32_t, int32_t> with_pending;
  if (!pending.empty()) {
    with_pending = output_counts_;
    for (int32_t id : pending) ++with_pending[id];
    counts = &with_pending;
  }

  // Processed logits: bias, penalties, bans.
  std::vector<float>& work = row_scratch().work;
  work.assign(logits.begin(), logits.end());
  for (auto& [id, b] : p_.logit_bias)
    if (id >= 0 && id < vocab) work[id] += b;
  if (p_.repetition_penalty != 1.0) {
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& v = work[id];
      v = v > 0 ? static_cast<float>(v / p_.repetition_penalty) : static_cast<float>(v * p_.repetition_penalty);
    };
    for (int32_t id : prompt_ids_) penalize(id);
    for (auto& [id, n] : *counts)
      if (!std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) penalize(id);
  }
  if (p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0) {
    for (auto& [id, n] : *counts) {
      if (id < 0 || id >= vocab) continue;
      work[id] -= static_cast<float>(p_.frequency_penalty * n + p_.presence_penalty);
    }
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int32_t id : banned)
    if (id >= 0 && id < vocab) work[id] = neg_inf;

  if (greedy()) {
    out.only = static_cast<int32_t>(std::max_element(work.begin(), work.end()) - work.begin());
    return out;
  }
  // Temperature (a NaN logit, from a broken row, is never a candidate) and the row's maximum, kept
  // in 8 lanes so the compares do not form one dependent chain over the vocabulary.
  const float inv_t = static_cast<float>(1.0 / p_.temperature);
  std::array<float, 8> lane;
  lane.fill(neg_inf);
  for (size_t i = 0; i < work.size(); ++i) {
    float& v = work[i];
    v = std::isnan(v) ? neg_inf : v * inv_t;
    lane[i % 8] = std::max(lane[i % 8], v);
  }
  const float m = *std::max_element(lane.begin(), lane.end());
  // Candidates sorted by processed logit, descending (ties: lower id first, deterministic).
  int32_t keep = vocab;
  if (p_.top_k > 0 && p_.top_k < vocab) keep = static_cast<int32_t>(p_.top_k);
  const std::span<const uint64_t> sorted = sort_candidates(work, keep);
  size_t count = sorted.size();
  while (count > 0 && candidate_value(sorted[count - 1]) == neg_inf) --count;
  if (count == 0) {  // everything banned: fall back to the best raw token
    out.only = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    return out;
  }
  // Weights exp(v - max) in candidate order (the exps on the thread pool), summed in that order.
  std::vector<double>& prob = row_scratch().values;
  prob.resize(count);
  parallel_for(
      static_cast<int64_t>(count),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) prob[i] = std::exp(static_cast<double>(candidate_value(sorted[i])) - m);
      },
      kParallelExpMin);
  double sum = 0.0;
  for (double q : prob) sum += q;
  for (double& q : prob) q /= sum;
  size_t n = count;
  if (p_.min_p > 0.0) {
    const double cut = p_.min_p * prob[0];
    while (n > 1 && prob[n - 1] < cut) --n;
  }
  if (p_.top_p < 1.0) {
    double c = 0.0;
    size_t i = 0;
    for (; i < n; ++i) {
      c += prob[i];
      if (c >= p_.top_p) break;
    }
    n = std::min(n, i + 1);
  }
  out.entries = sorted.first(n);
  out.weights = std::span<const double>(prob.data(), n);
  out.total = 0.0;
  for (double w : out.weights) out.total += w;
  return out;
}

TokenDistribution Sampler::distribution(std::span<const float> logits, std::span<const int32_t> banned,
                                        std::span<const int32_t> pending) const {
  const Weighted w = weigh(logits, banned, pending);
  TokenDistribution out;
  if (w.only >= 0) {
    out.ids.push_back(w.only);
    out.weights.push_back(1.0);
    out.total = 1.0;
    return out;
  }
  out.ids.resize(w.entries.size());
  for (size_t i = 0; i < w.entries.size(); ++i) out.ids[i] = candidate_id(w.entries[i]);
  out.weights.assign(w.weights.begin(), w.weights.end());
  out.total = w.total;
  return out;
}

bool Sampler::raw_argmax(std::span<const int32_t> banned) const {
  return greedy() && banned.empty() && p_.logit_bias.empty() && p_.repetition_penalty == 1.0 &&
         p_.presence_penalty == 0.0 && p_.frequency_penalty == 0.0 && p_.top_logprobs < 0;
}

// 53-bit uniform from the raw engine output: identical on every standard library.
double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

SampledToken Sampler::sample(std::span<const float> logits, std::span<const int32_t> banned) {
  // distribution() + pick() without copying the candidates out of the scratch.
  const Weighted w = weigh(logits, banned, {});
  int32_t chosen = w.only;
  if (!greedy()) {
    const double u = uniform();  // drawn for every non-greedy token, one candidate or many
    if (chosen < 0) chosen = candidate_id(w.entries[pick_index(w.weights, w.total, u)]);
  }
  return record(chosen, logits);
}

SampledToken Sampler::record(int32_t chosen, std::span<const float> logits) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SampledToken out;
  ++output_counts_[chosen];

  out.id = chosen;
  if (p_.top_logprobs >= 0) {
    const double lse = log_sum_exp(logits);
    out.logprob = static_cast<float>(logits[chosen] - lse);
    if (p_.top_logprobs > 0) {
      const int32_t k = std::min<int32_t>(p_.top_logprobs, vocab);
      for (uint64_t e : sort_candidates(logits, k)) {  // larger raw logit first, lower id among ties
        const int32_t id = candidate_id(e);
        out.top.emplace_back(id, static_cast<float>(logits[id] - lse));
      }
    }
  }
  return out;
}

}  // namespace dsv41::sched
