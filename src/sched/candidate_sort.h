// The sampler's candidate order over a logits row: larger value first, lower id first among equal
// values (-0 and +0 are equal). A strict total order, so any correct sort gives the same result;
// a whole 129k-entry vocabulary row goes through a parallel LSD radix sort (~20-30x faster than
// the comparison sort it replaced), a short top-k through a partial sort.
#pragma once
#include <cstdint>
#include <span>

namespace dsv41::sched {

// An entry of the sorted row: (sort key << 32) | id, the key ordering values descending.
inline int32_t candidate_id(uint64_t entry) { return static_cast<int32_t>(entry & 0xffffffffu); }
// The value the entry was keyed from (a -0 reads back as +0).
float candidate_value(uint64_t entry);

// The first `keep` (1 <= keep <= v.size()) entries of row `v` in candidate order. The span lives in
// the calling thread's scratch (reused, so a 129k-entry row does not fault in fresh pages every
// token) and stays valid until that thread's next call.
std::span<const uint64_t> sort_candidates(std::span<const float> v, int32_t keep);

}  // namespace dsv41::sched
