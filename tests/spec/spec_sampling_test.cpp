// Sampling with speculation keeps the target's distribution, on the tiny model's real drafter and
// target rows: many seeded speculative steps from one state, chi-square of the first committed
// token against the target's processed distribution. The same harness rejects the draft's own
// distribution (what "accept every draft" would emit), so the test can fail. Plus seeded
// reproducibility through the scheduler.
#include <gtest/gtest.h>

#include "chi_square.h"
#include "spec/speculator.h"
#include "spec_fixture.h"

using namespace dsv41;

namespace {

struct StepData {
  spec::Draft draft;
  std::vector<float> rows;  // target rows of the verify forward over [anchor, greedy drafts]
  int64_t vocab = 0;
};

// Prefill the fixture prompt, take its greedy token as the anchor, draft, and verify the drafter's
// greedy chain with the CPU backend.
StepData real_step(model::CpuModel& m) {
  const auto prompt = test_support::golden_ids("tiny-s0", "prompt_ids");
  auto st = m.new_sequence();
  st->prompt_len = static_cast<int64_t>(prompt.size());
  std::vector<float> lg;
  m.forward_sequence(*st, prompt, false, &lg);
  const int32_t anchor = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
  auto backend = spec::make_cpu_spec_backend(m);
  StepData d;
  d.vocab = m.config().vocab_size;
  spec::DraftItem item{st.get(), anchor, &d.draft};
  backend->draft(std::span<spec::DraftItem>(&item, 1));
  ForwardItem f;
  f.state = st.get();
  f.tokens = d.draft.ids;
  f.all_logits = true;
  f.logits = &d.rows;
  const uint8_t verify = 1;
  backend->forward(std::span<ForwardItem>(&f, 1), std::span<const uint8_t>(&verify, 1));
  backend->rollback(*st, 1);
  return d;
}

sched::SamplingParams params(uint64_t seed) {
  sched::SamplingParams p;
  p.temperature = 0.7;
  p.top_k = 40;
  p.frequency_penalty = 0.3;
  p.has_seed = true;
  p.seed = seed;
  return p;
}


// n seeded speculative steps on `d`; chi-square of the first committed token (and of the first
// draft alone) against the target's processed distribution of row 0.
struct FirstTokenResult {
  test_support::ChiSquare spec, drafts_alone;
  int64_t accepted = 0;
};

FirstTokenResult first_tokens(const StepData& d, int64_t n) {
  const int64_t V = d.vocab;
  const int64_t block = static_cast<int64_t>(d.draft.confidence.size());
  std::span<const float> row0(d.rows.data(), static_cast<size_t>(V));
  std::map<int32_t, double> expected;
  {
    const sched::Sampler s(params(0), {});
    const auto p = s.distribution(row0);
    for (size_t i = 0; i < p.ids.size(); ++i) expected[p.ids[i]] = p.weights[i] / p.total;
  }
  spec::SpecOptions so;
  so.method = spec::SpecMethod::dspark;
  so.adaptive = false;
  std::map<int32_t, int64_t> spec_counts, draft_counts;
  FirstTokenResult r;
  for (int64_t i = 0; i < n; ++i) {
    sched::Sampler s(params(1000 + static_cast<uint64_t>(i)), {});
    spec::SeqSpeculator sp(so, block);
    EXPECT_GE(sp.propose(d.draft, block, s, {}, 0), 1);
    ++draft_counts[sp.verify_tokens()[1]];
    // Rows beyond the first belong to the greedy chain; only row 0 decides the first token.
    std::vector<float> rows(d.rows.begin(), d.rows.begin() + (sp.k() + 1) * V);
    const auto out = sp.verify(rows, V, s, {}, 0);
    EXPECT_FALSE(out.tokens.empty());
    if (out.tokens.empty()) break;
    ++spec_counts[out.tokens[0].id];
    r.accepted += out.accepted > 0;
  }
  r.spec = test_support::chi_square(spec_counts, expected, n);
  r.drafts_alone = test_support::chi_square(draft_counts, expected, n);
  return r;
}

}  // namespace

TEST(SpecSampling, FirstTokenFollowsTheTargetDistribution) {
  auto m = test_support::load_tiny("tiny-s0");
  const StepData real = real_step(*m);
  // The tiny model's drafter (random weights) and a drafter whose first row leans towards the
  // target (0.6 target + 0.4 drafter logits): the first rejects almost everything, the second
  // accepts often and rejects often, so both branches of the rule are exercised.
  StepData leaning = real;
  for (int64_t v = 0; v < real.vocab; ++v)
    leaning.draft.logits[static_cast<size_t>(v)] = 0.6f * real.rows[static_cast<size_t>(v)] +
                                                  0.4f * real.draft.logits[static_cast<size_t>(v)];
  const int64_t n = 20000;
  for (const auto& [name, d] : std::vector<std::pair<const char*, const StepData*>>{{"own drafter", &real},
                                                                                  {"leaning drafter", &leaning}}) {
    const FirstTokenResult r = first_tokens(*d, n);
    EXPECT_FALSE(r.spec.rejects()) << name << ": chi2 " << r.spec.statistic << " > " << r.spec.critical << " (df "
                                   << r.spec.df << ")";
    // The drafts alone (accept-everything) do not follow the target: the test has teeth here.
    EXPECT_TRUE(r.drafts_alone.rejects()) << name << ": drafts alone chi2 " << r.drafts_alone.statistic
                                          << " <= " << r.drafts_alone.critical;
    std::cout << name << ": first draft accepted " << r.accepted << " of " << n << "; chi2 " << r.spec.statistic
              << " (critical " << r.spec.critical << ", df " << r.spec.df << "), drafts alone "
              << r.drafts_alone.statistic << "\n";
    if (d == &leaning) {
      EXPECT_GT(r.accepted, n / 10);
      EXPECT_LT(r.accepted, n - n / 10);
    }
  }
}

TEST(SpecSampling, SeededSamplingIsReproducible) {
  auto m = test_support::load_tiny("tiny-s0");
  auto backend = spec::make_cpu_spec_backend(*m);
  const auto prompt = test_support::golden_ids("tiny-s0", "prompt_ids");
  auto run = [&](uint64_t seed) {
    sched::SchedulerOptions so;
    so.max_num_batched_tokens = 4096;
    so.spec.method = spec::SpecMethod::dspark;
    sched::Scheduler s(*m, so, backend.get());
    sched::GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 12;
    r.sampling = params(seed);
    auto ch = s.submit(r);
    s.start();
    return test_support::collect_ids(*ch);
  };
  const auto a = run(5), b = run(5), c = run(6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}
