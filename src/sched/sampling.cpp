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

SampledToken Sampler::sample(std::span<const float> logits, std::span<const int32_t> banned) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SampledToken out;

  // Processed logits: bias, penalties, bans.
  work_.assign(logits.begin(), logits.end());
  for (auto& [id, b] : p_.logit_bias)
    if (id >= 0 && id < vocab) work_[id] += b;
  if (p_.repetition_penalty != 1.0) {
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& v = work_[id];
      v = v > 0 ? static_cast<float>(v / p_.repetition_penalty) : static_cast<float>(v * p_.repetition_penalty);
    };
    for (int32_t id : prompt_ids_) penalize(id);
    for (auto& [id, n] : output_counts_)
      if (!std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) penalize(id);
  }
  if (p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0) {
    for (auto& [id, n] : output_counts_) {
      if (id < 0 || id >= vocab) continue;
      work_[id] -= static_cast<float>(p_.frequency_penalty * n + p_.presence_penalty);
    }
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int32_t id : banned)
    if (id >= 0 && id < vocab) work_[id] = neg_inf;

  int32_t chosen = 0;
  if (p_.temperature < 1e-5 || p_.top_k == 1) {
    chosen = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else {
    const float inv_t = static_cast<float>(1.0 / p_.temperature);
    float m = neg_inf;
    for (float& v : work_) {
      v *= inv_t;
      m = std::max(m, v);
    }
    // Candidates sorted by processed logit, descending (ties: lower id first, deterministic).
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    int32_t keep = vocab;
    if (p_.top_k > 0 && p_.top_k < vocab) keep = static_cast<int32_t>(p_.top_k);
    auto by_logit = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
    order_.resize(keep);
    while (!order_.empty() && work_[order_.back()] == neg_inf) order_.pop_back();
    if (order_.empty()) {  // everything banned: fall back to the best raw token
      order_.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    std::vector<double> prob(order_.size());
    double sum = 0.0;
    for (size_t i = 0; i < order_.size(); ++i) sum += prob[i] = std::exp(static_cast<double>(work_[order_[i]]) - m);
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
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += prob[i];
    // 53-bit uniform from the raw engine output: identical on every standard library.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double c = 0.0;
    chosen = order_[n - 1];
    for (size_t i = 0; i < n; ++i) {
      c += prob[i];
      if (u < c) {
        chosen = order_[i];
        break;
      }
    }
  }
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
