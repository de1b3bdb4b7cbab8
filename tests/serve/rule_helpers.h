// Helpers shared by the scheduler/API tests over the rule model (tests/serve/test_model.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "sched/scheduler.h"
#include "test_model.h"

namespace dsv41::test_support {

// What the rule model generates greedily after `h`, computed without the scheduler.
inline std::vector<int32_t> rule_greedy(const RuleModel& m, std::vector<int32_t> h, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(m.favourite(h));
    h.push_back(out.back());
  }
  return out;
}

// A prompt of `len` ids drawn from the seed (ids 3..502, clear of the special ids).
inline std::vector<int32_t> random_prompt(int seed, int len) {
  std::mt19937 g(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(3 + static_cast<int32_t>(g() % 500));
  return p;
}

// Every id a channel delivers until it closes.
inline std::vector<int32_t> drain_ids(sched::TokenChannel& ch) {
  std::vector<sched::SampledToken> got;
  while (!ch.wait(got, std::chrono::milliseconds(50))) {
  }
  std::vector<int32_t> ids;
  for (auto& t : got) ids.push_back(t.id);
  return ids;
}

}  // namespace dsv41::test_support
