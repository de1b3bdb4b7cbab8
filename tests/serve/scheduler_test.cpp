// The engine loop on the rule test double: batching, chunked prefill, preemption and
// cancellation must never change a sequence's tokens, and every state must be returned.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "sched/scheduler.h"
#include "rule_helpers.h"
#include "test_model.h"

using namespace dsv41;
using namespace std::chrono_literals;

namespace {

sched::GenerationRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  sched::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

double gib_for_tokens(const ModelConfig& c, int64_t tokens_per_seq, int seqs) {
  const auto b = sched::state_bytes(c);
  const double block = 16.0 * b.packed_per_token;
  const double fixed_blocks = std::ceil(b.packed_fixed / block);
  return seqs * (fixed_blocks + std::ceil(tokens_per_seq / 16.0)) * block / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

TEST(Scheduler, BatchedOutputsEqualSequentialReference) {
  test_support::RuleModel m(test_support::tiny_config());
  sched::SchedulerOptions o;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 24;  // prompts of 40 tokens are prefilled in chunks
  sched::Scheduler s(m, o);
  // Everything is queued before the loop starts, so batching cannot depend on thread timing.
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < 10; ++i) chans.push_back(s.submit(greedy(test_support::random_prompt(i, 40), 20)));
  s.start();
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(test_support::drain_ids(*chans[i]), test_support::rule_greedy(m, test_support::random_prompt(i, 40), 20)) << "request " << i;
    EXPECT_EQ(chans[i]->finish_reason(), sched::FinishReason::length);
  }
  EXPECT_LE(m.max_batch(), 4);
  EXPECT_LE(m.max_step_tokens(), 24);
  EXPECT_GE(m.max_batch(), 2);  // continuous batching really batched
  s.stop();
  EXPECT_EQ(m.live(), 0);
  EXPECT_EQ(s.pool().used_bytes(), 0);
}

TEST(Scheduler, PreemptionRecomputesWithoutChangingOutputs) {
  test_support::RuleModel m(test_support::tiny_config());
  sched::SchedulerOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  // Room for about 2.5 sequences of 100 tokens: 6 sequences must take turns and get preempted.
  o.kv_cache_gib = gib_for_tokens(m.config(), 100, 2) * 1.25;
  sched::Scheduler s(m, o);
  // All six queued before the loop starts: otherwise the first could finish before the last arrive,
  // and then nothing needs preempting.
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < 6; ++i) chans.push_back(s.submit(greedy(test_support::random_prompt(100 + i, 20), 80)));
  s.start();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(test_support::drain_ids(*chans[i]), test_support::rule_greedy(m, test_support::random_prompt(100 + i, 20), 80)) << i;
  EXPECT_GT(s.stats().preemptions_total, 0);
  s.stop();
  EXPECT_EQ(m.live(), 0);
}

TEST(Scheduler, CancelFreesStateWithinAStep) {
  test_support::RuleModel m(test_support::tiny_config());
  m.step_delay_ms = 5;
  sched::Scheduler s(m, {});
  s.start();
  auto ch = s.submit(greedy(test_support::random_prompt(1, 10), 100));
  std::vector<sched::SampledToken> got;
  while (got.size() < 3) ch->wait(got, 50ms);
  const int64_t steps_at_cancel = m.steps();
  ch->cancel();
  const auto t0 = std::chrono::steady_clock::now();
  while (m.live() != 0 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(m.live(), 0);
  // Counted in engine steps, not wall time, so a loaded CI machine cannot make it flaky: the step
  // in flight when cancel() arrived may finish, the next one must not carry the sequence.
  EXPECT_LE(m.steps() - steps_at_cancel, 1);
  while (!ch->wait(got, 50ms)) {
  }
  EXPECT_EQ(ch->finish_reason(), sched::FinishReason::abort);
  EXPECT_EQ(s.pool().used_bytes(), 0);
}

TEST(Scheduler, EosStopIdsMinTokensAndLimits) {
  test_support::RuleModel m(test_support::tiny_config());
  sched::Scheduler s(m, {});
  s.start();
  auto p = test_support::random_prompt(5, 8);
  const auto ref = test_support::rule_greedy(m, p, 10);
  auto r = greedy(p, 10);
  r.stop_token_ids = {ref[4]};
  auto ch = s.submit(r);
  auto ids = test_support::drain_ids(*ch);
  // The stop id ends the sequence and is delivered last (it was generated: usage counts it).
  EXPECT_EQ(ids, std::vector<int32_t>(ref.begin(), ref.begin() + 5));
  EXPECT_EQ(ch->finish_reason(), sched::FinishReason::stop);
  // min_tokens bans the stop id: the sampler takes the next best token instead
  r.min_tokens = 6;
  ch = s.submit(r);
  ids = test_support::drain_ids(*ch);
  ASSERT_GE(ids.size(), 5u);
  EXPECT_NE(ids[4], ref[4]);
  // Context and pool limits are refused at submission.
  EXPECT_THROW(s.submit(greedy(test_support::random_prompt(1, 100), 29)), Error);
  EXPECT_THROW(s.submit(greedy({}, 4)), Error);
  EXPECT_THROW(s.submit(greedy({600}, 4)), Error);
}

TEST(Scheduler, SeededSamplingIsReproducibleUnderBatching) {
  test_support::RuleModel m(test_support::tiny_config());
  sched::SchedulerOptions o;
  o.max_num_seqs = 3;
  sched::Scheduler s(m, o);
  s.start();
  auto seeded = [&](uint64_t seed) {
    auto r = greedy(test_support::random_prompt(9, 12), 30);
    r.sampling.temperature = 1.0;
    r.sampling.has_seed = true;
    r.sampling.seed = seed;
    return r;
  };
  auto a = s.submit(seeded(42));
  auto noise1 = s.submit(seeded(1));
  auto b = s.submit(seeded(42));
  auto noise2 = s.submit(seeded(2));
  const auto ia = test_support::drain_ids(*a), ib = test_support::drain_ids(*b), n1 = test_support::drain_ids(*noise1);
  test_support::drain_ids(*noise2);
  EXPECT_EQ(ia, ib);
  EXPECT_NE(ia, n1);
}

TEST(Scheduler, PlainGreedyPicksComeFromTheBackend) {
  test_support::RuleModel m(test_support::tiny_config());
  m.picks_greedy = true;
  sched::SchedulerOptions o;
  o.max_num_seqs = 3;
  o.max_num_batched_tokens = 16;  // chunked prefill: only the chunk that completes a prompt samples
  sched::Scheduler s(m, o);
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < 3; ++i) chans.push_back(s.submit(greedy(test_support::random_prompt(20 + i, 30), 12)));
  s.start();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(test_support::drain_ids(*chans[static_cast<size_t>(i)]),
              test_support::rule_greedy(m, test_support::random_prompt(20 + i, 30), 12))
        << "request " << i;
  EXPECT_EQ(m.greedy_picks.load(), 3 * 12);  // every sampled token, from the backend

  // Anything that edits or reports the row keeps the logits: temperature, penalties, bias,
  // logprobs, and bans (min_tokens) while they apply.
  auto with = [&](auto edit) {
    auto r = greedy(test_support::random_prompt(40, 10), 6);
    edit(r);
    return r;
  };
  std::vector<sched::GenerationRequest> keep_logits = {
      with([](auto& r) { r.sampling.temperature = 0.8; r.sampling.has_seed = true; }),
      with([](auto& r) { r.sampling.presence_penalty = 0.5; }),
      with([](auto& r) { r.sampling.logit_bias[7] = 1.0f; }),
      with([](auto& r) { r.sampling.top_logprobs = 2; }),
  };
  m.greedy_picks = 0;
  for (auto& r : keep_logits) {
    auto ch = s.submit(r);
    const auto got = test_support::drain_ids(*ch);
    EXPECT_EQ(got.size(), 6u);
    for (int32_t id : got) EXPECT_TRUE(id >= 0 && id < m.config().vocab_size);
  }
  EXPECT_EQ(m.greedy_picks.load(), 0);
  auto banned = greedy(test_support::random_prompt(41, 10), 6);
  banned.min_tokens = 4;  // EOS banned for the first 4 tokens, then plain greedy again
  test_support::drain_ids(*s.submit(banned));
  EXPECT_EQ(m.greedy_picks.load(), 2);
  s.stop();
}

TEST(Scheduler, QueueLimitRefusesWithOverloaded) {
  test_support::RuleModel m(test_support::tiny_config());
  m.step_delay_ms = 20;
  sched::SchedulerOptions o;
  o.max_num_seqs = 1;
  o.max_waiting = 2;
  sched::Scheduler s(m, o);
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  chans.push_back(s.submit(greedy(test_support::random_prompt(1, 4), 5)));
  chans.push_back(s.submit(greedy(test_support::random_prompt(2, 4), 5)));
  EXPECT_THROW(s.submit(greedy(test_support::random_prompt(3, 4), 5)), sched::Overloaded);
  s.start();
  for (auto& c : chans) test_support::drain_ids(*c);
  s.stop();
  EXPECT_EQ(m.live(), 0);
}
