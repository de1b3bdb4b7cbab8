#include "spec/speculator.h"

#include <algorithm>

#include "dsv41/common/error.h"
#include "spec/rejection.h"

namespace dsv41::spec {

SeqSpeculator::SeqSpeculator(const SpecOptions& o, int64_t block_size)
    : opt_(o),
      max_drafts_(o.max_draft_tokens > 0 ? std::min(o.max_draft_tokens, block_size) : block_size),
      policy_(o.min_chain_prob) {}

bool SeqSpeculator::wants_draft() const {
  return opt_.method != SpecMethod::none && max_drafts_ >= 1 && !(opt_.adaptive && policy_.paused());
}

int64_t SeqSpeculator::propose(const Draft& d, int64_t cap, sched::Sampler& s, const BanRule& bans,
                               int64_t n_generated) {
  const int64_t block = static_cast<int64_t>(d.confidence.size());
  DSV_ASSERT(block >= 1 && d.ids.size() == static_cast<size_t>(block + 1) && !d.logits.empty() &&
                 d.logits.size() % static_cast<size_t>(block) == 0,
             "malformed draft: {} ids, {} logits, {} confidences", d.ids.size(), d.logits.size(), block);
  const size_t V = d.logits.size() / static_cast<size_t>(block);
  tokens_.assign(1, d.ids[0]);
  q_.clear();
  confidence_ = d.confidence;
  cap = std::min({cap, max_drafts_, block});
  if (cap < 1) return 0;
  const int64_t want = opt_.adaptive ? policy_.choose(d.confidence, cap) : cap;
  std::vector<int32_t> pending;
  for (int64_t i = 1; i <= want; ++i) {
    std::span<const float> row(d.logits.data() + static_cast<size_t>(i - 1) * V, V);
    sched::TokenDistribution q = s.distribution(row, bans.at(n_generated + i - 1), pending);
    const int32_t di = s.greedy() ? q.ids.front() : q.pick(s.uniform());
    tokens_.push_back(di);
    q_.push_back(std::move(q));
    pending.push_back(di);
    // Row i+1 carries the Markov bias of the drafter's own choice ids[i]; after a different token
    // its distribution is not the drafter's any more, so the chain stops here.
    if (di != d.ids[static_cast<size_t>(i)]) break;
  }
  return k();
}

void SeqSpeculator::truncate(int64_t k) {
  if (k < this->k()) {
    tokens_.resize(static_cast<size_t>(std::max<int64_t>(k, 0) + 1));
    q_.resize(tokens_.size() - 1);
  }
}

VerifyOutcome SeqSpeculator::verify(std::span<const float> rows, int64_t vocab, sched::Sampler& s,
                                    const BanRule& bans, int64_t n_generated) {
  const int64_t k = this->k();
  DSV_ASSERT(k >= 1 && rows.size() == static_cast<size_t>((k + 1) * vocab), "verify: {} logits for {} rows of {}",
             rows.size(), k + 1, vocab);
  VerifyOutcome out;
  auto uniform = [&s] { return s.uniform(); };
  for (int64_t i = 0; i <= k; ++i) {
    std::span<const float> row = rows.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
    // The sampler has recorded the drafts accepted so far, so penalties see them as q_ did.
    const sched::TokenDistribution p = s.distribution(row, bans.at(n_generated + i));
    if (i == k) {  // every draft accepted: the bonus token from the last row
      out.tokens.push_back(s.record(s.greedy() ? p.ids.front() : p.pick(s.uniform()), row));
      break;
    }
    const Verdict v = accept_or_resample(p, q_[static_cast<size_t>(i)], tokens_[static_cast<size_t>(i + 1)], uniform);
    out.tokens.push_back(s.record(v.token, row));
    if (!v.accepted) break;
    ++out.accepted;
  }
  if (opt_.adaptive) policy_.observe(confidence_, k, out.accepted);
  return out;
}

}  // namespace dsv41::spec
