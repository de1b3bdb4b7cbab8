// Speculative decoding counters, kept by the scheduler and rendered on /metrics.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv41::spec {

struct SpecStats {
  int64_t verify_steps = 0;      // target steps of a sequence that verified drafts
  int64_t draft_tokens = 0;      // drafts verified
  int64_t accepted_tokens = 0;   // drafts accepted
  int64_t fallback_steps = 0;    // sequence-steps that skipped speculation because the batch was wide
  // accepted_at_position[i]: steps whose draft i+1 was accepted.
  std::vector<int64_t> accepted_at_position;
  // by_k[k][a]: steps that verified k drafts and accepted a of them (k, a from 0; row 0 unused).
  std::vector<std::vector<int64_t>> by_k;

  // Records one verify step with k drafts of which `accepted` were accepted.
  void record(int64_t k, int64_t accepted);
  double acceptance_rate() const { return draft_tokens > 0 ? double(accepted_tokens) / double(draft_tokens) : 0.0; }
  // Tokens committed per verify step (accepted drafts + the corrected or bonus token).
  double mean_accepted_length() const {
    return verify_steps > 0 ? 1.0 + double(accepted_tokens) / double(verify_steps) : 0.0;
  }
};

}  // namespace dsv41::spec
