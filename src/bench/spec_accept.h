// DSpark acceptance measured on golden files (tests/fixtures/*/golden.safetensors): the stand-in
// acceptance rate of `dsv41-serve bench decode --spec-tokens K` until a real checkpoint's drafts
// can be measured. Row i of dspark_draft_ids is [anchor, d1 .. dB] drafted after decode step i,
// whose anchor is greedy_ids[i+1]; draft j is right when it equals greedy_ids[i+1+j]. Greedy
// verification accepts the longest right prefix, so draft j is "tried" only when d1 .. d(j-1)
// were all accepted (and greedy_ids reaches that far).
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dsv41::bench {

struct Acceptance {
  int64_t tried = 0, accepted = 0;  // drafts compared / accepted, over all depths
  int64_t rows = 0;                 // draft blocks read
  double rate() const { return tried > 0 ? static_cast<double>(accepted) / static_cast<double>(tried) : 0.0; }
};

// Sums the acceptance of every file (each must hold greedy_ids and dspark_draft_ids, I32).
Acceptance measure_acceptance(const std::vector<std::string>& golden_files);

// Accepted drafts of one verify step of k drafts when each is accepted with probability `rate`
// given its predecessors were (the first rejection ends the prefix).
int64_t simulate_accepted(double rate, int64_t k, std::mt19937_64& rng);

}  // namespace dsv41::bench
