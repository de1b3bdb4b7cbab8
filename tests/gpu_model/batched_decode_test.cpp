// Batched decode on the CUDA backend (src/cuda_model/cuda_decode_batch.cpp): the one-token decode
// steps of several sequences in one CudaModel::forward call run as one pass, and each sequence's
// logits must be bit-identical to the same sequence stepped alone (every op's row arithmetic is
// independent of the other rows), and match the CPU engine by the rule of cpu_parity_test.cpp.
// Sequences have different prompt lengths (rings partly filled and wrapped, different numbers of
// compressed entries and top-k lengths), join with their prefill in the same call as the others'
// decode steps and leave between steps; some steps ask for no logits or for all of them. With
// DSpark loaded the rings the batched passes fed must give the same drafts; EXL3 checkpoints
// (whose kernel path depends on the row count, so batches keep to its single-row path) must
// match too, as must an arena smaller than the batch (several passes per step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../support/mkmodel_variants.h"
#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "model_check.h"

using namespace dsv41;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = DSV41_FIXTURES_DIR;
constexpr double kRelTol = 1e-3;  // cpu_parity_test.cpp

// A sequence of the schedule: its prefill runs in the forward call of step `join`, then one decode
// step per call until step `leave` (exclusive), fed feed[0], feed[1], ...
struct SeqPlan {
  std::vector<int32_t> prompt;
  int64_t join = 0, leave = 0;
  std::vector<int32_t> feed;
};

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

std::vector<SeqPlan> make_plans(const std::vector<int64_t>& prompt_lens, const std::vector<std::pair<int64_t, int64_t>>& spans,
                                int64_t vocab, uint32_t seed) {
  std::vector<SeqPlan> plans;
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    SeqPlan p;
    p.prompt = random_ids(prompt_lens[i], vocab, seed + static_cast<uint32_t>(i) * 7);
    p.join = spans[i].first;
    p.leave = spans[i].second;
    p.feed = random_ids(std::max<int64_t>(0, p.leave - p.join - 1), vocab, seed + 1000 + static_cast<uint32_t>(i));
    plans.push_back(std::move(p));
  }
  return plans;
}

// What a run of the schedule produced: per sequence its recorded logits rows (the prefill's last
// row, then each decode step that asked for logits) and its state at the end.
struct ScheduleRun {
  std::vector<std::vector<float>> logits;
  std::vector<std::unique_ptr<SeqState>> states;
};

// Runs the schedule on `m`. together: each step is one forward call over all its items (the
// engine batches the decode steps); otherwise every item is a forward call of its own.
// Step s of sequence i skips its logits when (i + s) % 5 == 3 and asks for all_logits when
// (i + s) % 4 == 1 (still one row for one token).
ScheduleRun run_schedule(Model& m, const std::vector<SeqPlan>& plans, bool together) {
  const int64_t V = m.config().vocab_size;
  int64_t steps = 0;
  for (const SeqPlan& p : plans) steps = std::max(steps, p.leave);
  ScheduleRun r;
  r.logits.resize(plans.size());
  r.states.resize(plans.size());
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<ForwardItem> items;
    std::vector<size_t> owner;
    std::vector<std::vector<float>> out(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) {
      const SeqPlan& p = plans[i];
      if (s < p.join || s >= p.leave) continue;
      ForwardItem it;
      if (s == p.join) {
        r.states[i] = m.new_sequence();
        r.states[i]->prompt_len = static_cast<int64_t>(p.prompt.size());
        it.tokens = p.prompt;
        it.logits = &out[i];
      } else {
        it.tokens = std::span<const int32_t>(&p.feed[static_cast<size_t>(s - p.join - 1)], 1);
        const int64_t k = static_cast<int64_t>(i) + s;
        it.logits = k % 5 == 3 ? nullptr : &out[i];
        it.all_logits = k % 4 == 1;
      }
      it.state = r.states[i].get();
      items.push_back(it);
      owner.push_back(i);
    }
    if (together) {
      m.forward(items);
    } else {
      for (ForwardItem& it : items) m.forward(std::span<ForwardItem>(&it, 1));
    }
    for (size_t j = 0; j < items.size(); ++j) {
      if (!items[j].logits) continue;
      const std::vector<float>& lg = *items[j].logits;
      EXPECT_EQ(static_cast<int64_t>(lg.size()), V) << "sequence " << owner[j] << " step " << s;
      auto& dst = r.logits[owner[j]];
      dst.insert(dst.end(), lg.begin(), lg.end());
    }
  }
  return r;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void expect_bit_identical(const ScheduleRun& got, const ScheduleRun& want, const std::string& what) {
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) {
    EXPECT_FALSE(want.logits[i].empty()) << what << ": sequence " << i << " recorded no logits";
    EXPECT_TRUE(bits_equal(got.logits[i], want.logits[i]))
        << what << ": sequence " << i << " batched logits differ from its steps alone (bit-identical fraction "
        << test::identical_fraction(got.logits[i], want.logits[i]) << ")";
  }
}

void expect_matches_cpu(const ScheduleRun& gpu, const ScheduleRun& cpu, int64_t V, const std::string& what) {
  for (size_t i = 0; i < gpu.logits.size(); ++i) {
    EXPECT_EQ(test::argmax_mismatches(gpu.logits[i], cpu.logits[i], V), 0) << what << ": sequence " << i << " argmax";
    const double e = test::worst_rel(gpu.logits[i], cpu.logits[i], V);
    EXPECT_LE(e, kRelTol) << what << ": sequence " << i << " logits";
    std::cout << what << " sequence " << i << ": rel err vs cpu " << e << " (bit-identical "
              << test::identical_fraction(gpu.logits[i], cpu.logits[i]) << ")\n";
  }
}

// The drafts of the sequences alive at the end, from the batched run's states and the solo run's:
// bit for bit; and against the CPU engine's (ids equal, values within 1e-4 as GpuDspark's test).
void expect_same_drafts(model::CudaModel& gpu, const ScheduleRun& batched, const ScheduleRun& alone,
                        const model::CpuModel* cpu, const ScheduleRun* cpu_run, const std::string& what) {
  int drafted = 0;
  for (size_t i = 0; i < batched.states.size(); ++i) {
    if (!batched.states[i] || batched.states[i]->n_past == 0) continue;
    const int32_t anchor = static_cast<int32_t>((i * 37 + 5) % static_cast<size_t>(gpu.config().vocab_size));
    const model::DsparkDraft a = gpu.dspark_draft(*batched.states[i], anchor);
    const model::DsparkDraft b = gpu.dspark_draft(*alone.states[i], anchor);
    EXPECT_EQ(a.ids, b.ids) << what << ": sequence " << i << " draft ids";
    EXPECT_TRUE(bits_equal(a.logits, b.logits)) << what << ": sequence " << i << " draft logits";
    EXPECT_TRUE(bits_equal(a.confidence, b.confidence)) << what << ": sequence " << i << " confidence";
    if (cpu) {
      const model::DsparkDraft c = cpu->dspark_draft(*cpu_run->states[i], anchor);
      EXPECT_EQ(a.ids, c.ids) << what << ": sequence " << i << " draft ids vs cpu";
      EXPECT_LE(test::worst_rel(a.logits, c.logits, gpu.config().vocab_size), 1e-4) << what << ": sequence " << i;
    }
    ++drafted;
  }
  EXPECT_GT(drafted, 0) << what << ": no sequence alive at the end";
}

model::CudaModelOptions cuda_opts(const std::string& fixture, int64_t k_parts, int64_t pass_tokens, bool dspark) {
  model::CudaModelOptions o;
  o.engram_token_map = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
  o.mix_gemm_k_parts = k_parts;
  o.max_chunk_tokens = pass_tokens;
  o.dspark = dspark;
  o.exact_block_sums = true;  // sequential block sums, no grouped MoE: compared with the CPU engine bit for bit
  return o;
}

// The schedule on one fixture model: batched vs alone (bit for bit), vs the CPU engine, and the
// drafts when DSpark is loaded.
void check_fixture(const std::string& fixture, int64_t k_parts, const std::vector<SeqPlan>& plans, bool dspark,
                   int64_t pass_tokens = 256) {
  const std::string what = fixture + (dspark ? " dspark" : "") + " pass " + std::to_string(pass_tokens);
  auto gpu = model::CudaModel::load(kFixtures + "/" + fixture + "/model", cuda_opts(fixture, k_parts, pass_tokens, dspark));
  ASSERT_EQ(gpu->has_dspark(), dspark);
  const ScheduleRun batched = run_schedule(*gpu, plans, true);
  const ScheduleRun alone = run_schedule(*gpu, plans, false);
  expect_bit_identical(batched, alone, what);
  model::CpuModelOptions co;
  co.engram_token_map = kFixtures + "/" + fixture + "/engram_token_map.safetensors";
  co.mix_gemm_k_parts = k_parts;
  co.dspark = dspark;
  auto cpu = model::CpuModel::load(kFixtures + "/" + fixture + "/model", co);
  const ScheduleRun on_cpu = run_schedule(*cpu, plans, true);
  expect_matches_cpu(batched, on_cpu, gpu->config().vocab_size, what);
  if (dspark) expect_same_drafts(*gpu, batched, alone, cpu.get(), &on_cpu, what);
}

// tiny-s0: window 16, top-k 8, context 128. Prompts from 1 token (ring almost empty) to past the
// window; two sequences leave early, three join later.
std::vector<SeqPlan> s0_plans() {
  return make_plans({1, 5, 12, 23, 40, 64}, {{0, 12}, {0, 7}, {2, 12}, {0, 9}, {3, 12}, {5, 12}}, 512, 17);
}

// tiny-long: window 32, top-k 16, context 512: hundreds of compressed entries, top-k lengths that
// differ between the sequences at first and agree later.
std::vector<SeqPlan> long_plans() {
  return make_plans({3, 31, 33, 70, 150}, {{0, 14}, {1, 14}, {0, 8}, {4, 14}, {2, 11}}, 512, 29);
}

}  // namespace

TEST(GpuBatchedDecode, TinyS0MatchesSingleStepsAndCpu) { check_fixture("tiny-s0", 0, s0_plans(), false); }

TEST(GpuBatchedDecode, TinyS0WithDsparkMatchesSingleStepsAndCpu) { check_fixture("tiny-s0", 0, s0_plans(), true); }

// The fixture's 3-part mixes GEMM (prefill only; decode rows use the one-row arithmetic).
TEST(GpuBatchedDecode, TinyLongWithDsparkMatchesSingleStepsAndCpu) {
  check_fixture("tiny-long", 3, long_plans(), true);
}

// An arena of 3 tokens per pass: the decode steps of 6 sequences take several passes per step.
TEST(GpuBatchedDecode, SmallArenaSplitsStepsIntoPasses) { check_fixture("tiny-s0", 0, s0_plans(), true, 3); }

// The server's device-side greedy sampling (ForwardItem::greedy_id): every step of the schedule
// (prefill and decode, batched and alone) picks the first maximum of the row the same step returns
// as logits, and leaves the logits vector alone.
TEST(GpuBatchedDecode, GreedyPicksAreTheArgmaxOfTheLogits) {
  auto m = model::CudaModel::load(kFixtures + "/tiny-s0/model", cuda_opts("tiny-s0", 0, 256, false));
  const std::vector<SeqPlan> plans = s0_plans();
  int64_t steps = 0;
  for (const SeqPlan& p : plans) steps = std::max(steps, p.leave);
  for (bool together : {true, false}) {
    std::vector<std::unique_ptr<SeqState>> with_logits(plans.size()), with_picks(plans.size());
    int64_t checked = 0;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<ForwardItem> a, b;
      std::vector<std::vector<float>> rows(plans.size()), untouched(plans.size());
      std::vector<int32_t> picks(plans.size(), -1);
      std::vector<size_t> owner;
      for (size_t i = 0; i < plans.size(); ++i) {
        const SeqPlan& p = plans[i];
        if (s < p.join || s >= p.leave) continue;
        std::span<const int32_t> tokens = p.prompt;
        if (s > p.join) {
          tokens = std::span<const int32_t>(&p.feed[static_cast<size_t>(s - p.join - 1)], 1);
        } else {
          for (auto* st : {&with_logits[i], &with_picks[i]}) {
            *st = m->new_sequence();
            (*st)->prompt_len = static_cast<int64_t>(p.prompt.size());
          }
        }
        a.push_back(ForwardItem{with_logits[i].get(), tokens, false, &rows[i]});
        b.push_back(ForwardItem{with_picks[i].get(), tokens, false, &untouched[i], &picks[i]});
        owner.push_back(i);
      }
      if (together) {
        m->forward(a);
        m->forward(b);
      } else {
        for (size_t j = 0; j < a.size(); ++j) {
          m->forward(std::span<ForwardItem>(&a[j], 1));
          m->forward(std::span<ForwardItem>(&b[j], 1));
        }
      }
      for (size_t i : owner) {
        const auto& row = rows[i];
        ASSERT_EQ(row.size(), static_cast<size_t>(m->config().vocab_size));
        EXPECT_EQ(picks[i], std::max_element(row.begin(), row.end()) - row.begin())
            << (together ? "batched" : "alone") << " sequence " << i << " step " << s;
        EXPECT_TRUE(untouched[i].empty()) << "sequence " << i << " step " << s << ": logits were downloaded";
        ++checked;
      }
    }
    EXPECT_GT(checked, 40);
  }
}

// A state named twice in one call advances item by item, as two calls would; the call's other
// decode steps still run batched.
TEST(GpuBatchedDecode, SameStateTwiceRunsInOrder) {
  auto m = model::CudaModel::load(kFixtures + "/tiny-s0/model", cuda_opts("tiny-s0", 0, 256, true));
  const std::vector<int32_t> p0 = random_ids(9, 512, 3), p1 = random_ids(20, 512, 4), p2 = random_ids(33, 512, 5);
  auto prefill = [&](const std::vector<int32_t>& p) {
    auto st = m->new_sequence();
    st->prompt_len = static_cast<int64_t>(p.size());
    m->forward_sequence(*st, p, false, nullptr);
    return st;
  };
  auto a = prefill(p0), b = prefill(p1), c = prefill(p2), a1 = prefill(p0), b1 = prefill(p1), c1 = prefill(p2);
  const int32_t t0 = 7, t1 = 300, t2 = 42, t3 = 99;
  std::vector<float> la0, la1, lb, lc, wa0, wa1, wb, wc;
  std::vector<ForwardItem> items = {{a.get(), std::span<const int32_t>(&t0, 1), false, &la0},
                                    {b.get(), std::span<const int32_t>(&t2, 1), false, &lb},
                                    {a.get(), std::span<const int32_t>(&t1, 1), false, &la1},
                                    {c.get(), std::span<const int32_t>(&t3, 1), false, &lc}};
  m->forward(items);
  m->forward_sequence(*a1, std::span<const int32_t>(&t0, 1), false, &wa0);
  m->forward_sequence(*a1, std::span<const int32_t>(&t1, 1), false, &wa1);
  m->forward_sequence(*b1, std::span<const int32_t>(&t2, 1), false, &wb);
  m->forward_sequence(*c1, std::span<const int32_t>(&t3, 1), false, &wc);
  EXPECT_EQ(a->n_past, 11);
  EXPECT_EQ(b->n_past, 21);
  EXPECT_EQ(c->n_past, 34);
  EXPECT_TRUE(bits_equal(la0, wa0));
  EXPECT_TRUE(bits_equal(la1, wa1));
  EXPECT_TRUE(bits_equal(lb, wb));
  EXPECT_TRUE(bits_equal(lc, wc));
  EXPECT_FALSE(bits_equal(la0, la1));
}

// A bad token in one decode step refuses the whole call with one clear error.
TEST(GpuBatchedDecode, BadTokenInABatchIsRefused) {
  auto m = model::CudaModel::load(kFixtures + "/tiny-s0/model", cuda_opts("tiny-s0", 0, 256, false));
  std::vector<std::unique_ptr<SeqState>> st;
  for (int i = 0; i < 3; ++i) {
    st.push_back(m->new_sequence());
    const std::vector<int32_t> p = random_ids(4 + i, 512, 50 + static_cast<uint32_t>(i));
    st.back()->prompt_len = static_cast<int64_t>(p.size());
    m->forward_sequence(*st.back(), p, false, nullptr);
  }
  const int32_t good = 5, bad = 512;
  std::vector<int64_t> before;
  for (const auto& s : st) before.push_back(s->n_past);
  std::vector<float> l0, l1, l2;
  std::vector<ForwardItem> items = {{st[0].get(), std::span<const int32_t>(&good, 1), false, &l0},
                                    {st[1].get(), std::span<const int32_t>(&bad, 1), false, &l1},
                                    {st[2].get(), std::span<const int32_t>(&good, 1), false, &l2}};
  try {
    m->forward(items);
    ADD_FAILURE() << "a token outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < st.size(); ++i) EXPECT_EQ(st[i]->n_past, before[i]) << "sequence " << i << " moved";
}

// EXL3 checkpoints: batched steps (at most 4 rows per pass, the single-row kernel path) equal the
// steps alone, bit for bit. Two variants: MUL1 (the int8 path) and MCG (the f16 path).
TEST(GpuBatchedDecode, Exl3MatchesSingleSteps) {
  for (const test::MkmodelVariant& v : test::mkmodel_exl3_variants()) {
    if (v.name != "exl3_mul1_b3" && v.name != "exl3_mcg_b2_5") continue;
    const std::string dir = std::string(::testing::TempDir()) + "/dsv41_gpu_batched_" + v.name;
    fs::remove_all(dir);
    const auto made = test::run_mkmodel(kFixtures, v, dir);
    ASSERT_EQ(made.exit_code, 0) << made.out;
    model::CudaModelOptions o = cuda_opts(v.fixture, 0, 256, false);
    auto m = model::CudaModel::load(dir, o);
    EXPECT_GT(m->memory().weights_exl3, 0);
    const std::vector<SeqPlan> plans = v.fixture == "tiny-s0" ? s0_plans() : long_plans();
    const ScheduleRun batched = run_schedule(*m, plans, true);
    const ScheduleRun alone = run_schedule(*m, plans, false);
    expect_bit_identical(batched, alone, v.name);
    fs::remove_all(dir);
  }
}
