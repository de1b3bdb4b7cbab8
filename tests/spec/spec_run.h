// Running the scheduler with speculative decoding in tests (CPU and GPU suites alike): a greedy
// request, scheduler options with DSpark on, and one request's ids and accepted counts per step.
#pragma once
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "dsv41/model/model.h"
#include "dsv41/spec/spec_backend.h"
#include "sched/scheduler.h"
#include "spec_fixture.h"

namespace dsv41::test_support {

inline sched::GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n, int64_t spec_tokens = -1) {
  sched::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0;
  r.spec_tokens = spec_tokens;
  return r;
}

inline sched::SchedulerOptions spec_options(int64_t k, bool adaptive) {
  sched::SchedulerOptions so;
  so.max_num_seqs = 8;
  so.max_num_batched_tokens = 4096;
  so.kv_cache_gib = 1.0;
  so.spec.method = spec::SpecMethod::dspark;
  so.spec.max_draft_tokens = k;
  so.spec.adaptive = adaptive;
  return so;
}

struct Generated {
  std::vector<int32_t> ids;
  std::vector<int64_t> accepted;
};

inline Generated generate(Model& m, spec::SpecBackend* backend, const sched::SchedulerOptions& so,
                   sched::GenerationRequest r, spec::SpecStats* stats = nullptr) {
  sched::Scheduler s(m, so, backend);
  auto ch = s.submit(std::move(r));
  s.start();
  Generated g;
  g.ids = collect_ids(*ch, &g.accepted);
  EXPECT_NE(ch->finish_reason(), sched::FinishReason::error) << ch->error();
  if (stats) *stats = s.stats().spec;
  s.stop();
  EXPECT_EQ(s.stats().pool_used_bytes, 0);
  return g;
}

inline int64_t sum(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

}  // namespace dsv41::test_support
