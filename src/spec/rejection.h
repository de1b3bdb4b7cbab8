// The acceptance rule of speculative sampling at one draft position (docs/SPECULATIVE.md §2).
#pragma once
#include <cstdint>
#include <functional>

#include "sched/sampling.h"

namespace dsv41::spec {

struct Verdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the replacement
};

// The draft `d` was drawn from q (the drafter's distribution after the request's transforms); p
// is the target's distribution at the same position after the same transforms. Accepts d with
// probability min(1, p(d)/q(d)); otherwise draws the replacement from normalise(max(p − q, 0)).
// The emitted token is then distributed exactly as p. `uniform` gives U[0,1) draws: one for the
// acceptance test, one more on rejection. A single-candidate p (greedy) decides without drawing:
// accept iff d is that candidate.
Verdict accept_or_resample(const sched::TokenDistribution& p, const sched::TokenDistribution& q, int32_t d,
                           const std::function<double()>& uniform);

}  // namespace dsv41::spec
