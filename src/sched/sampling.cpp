#include "sched/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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

// log-softmax value of every id is logit - lse; computed in double so that 129k-wide rows keep
// their small probabilities.
double log_sum_exp(std::span<const float> x) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : x) m = std::max(m, v);
  if (!std::isfinite(m)) return m;
  double s = 0.0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

}  // namespace

double TokenDistribution::prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return total > 0.0 ? weights[i] / total : 0.0;
  return 0.0;
}

int32_t TokenDistribution::pick(double u) const {
  const double x = u * total;
  double c = 0.0;
  int32_t chosen = ids.back();
  for (size_t i = 0; i < ids.size(); ++i) {
    c += weights[i];
    if (x < c) {
      chosen = ids[i];
      break;
    }
  }
  return chosen;
}

TokenDistribution Sampler::distribution(std::span<const float> logits, std::span<const int32_t> banned,
                                        std::span<const int32_t> pending) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  TokenDistribution out;

  // Output counts for the penalties: the recorded ones, plus `pending` (speculative positions).
  const std::unordered_map<int32_t, int32_t>* counts = &output_counts_;
  std::unordered_map<int32_t, int32_t> with_pending;
  if (!pending.empty()) {
    with_pending = output_counts_;
    for (int32_t id : pending) ++with_pending[id];
    counts = &with_pending;
  }

  // Processed logits: bias, penalties, bans.
  std::vector<float> work(logits.begin(), logits.end());
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
    out.ids.push_back(static_cast<int32_t>(std::max_element(work.begin(), work.end()) - work.begin()));
    out.weights.push_back(1.0);
    out.total = 1.0;
    return out;
  }
  const float inv_t = static_cast<float>(1.0 / p_.temperature);
  float m = neg_inf;
  for (float& v : work) {
    v *= inv_t;
    m = std::max(m, v);
  }
  // Candidates sorted by processed logit, descending (ties: lower id first, deterministic).
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  int32_t keep = vocab;
  if (p_.top_k > 0 && p_.top_k < vocab) keep = static_cast<int32_t>(p_.top_k);
  auto by_logit = [&](int32_t a, int32_t b) { return work[a] > work[b] || (work[a] == work[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
  order.resize(static_cast<size_t>(keep));
  while (!order.empty() && work[order.back()] == neg_inf) order.pop_back();
  if (order.empty()) {  // everything banned: fall back to the best raw token
    out.ids.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    out.weights.push_back(1.0);
    out.total = 1.0;
    return out;
  }
  std::vector<double> prob(order.size());
  double sum = 0.0;
  for (size_t i = 0; i < order.size(); ++i) sum += prob[i] = std::exp(static_cast<double>(work[order[i]]) - m);
  for (double& q : prob) q /= sum;
  size_t n = prob.size();
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
  out.ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
  out.weights.assign(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(n));
  for (size_t i = 0; i < n; ++i) out.total += prob[i];
  return out;
}

// 53-bit uniform from the raw engine output: identical on every standard library.
double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

SampledToken Sampler::sample(std::span<const float> logits, std::span<const int32_t> banned) {
  const TokenDistribution d = distribution(logits, banned);
  const int32_t chosen = greedy() ? d.ids.front() : d.pick(uniform());
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
      std::vector<int32_t> ids(vocab);
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      for (int32_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], static_cast<float>(logits[ids[i]] - lse));
    }
  }
  return out;
}

}  // namespace dsv41::sched
