// Speculative decoding on the CPU reference engine: generated tokens per second through the
// scheduler at batch 1, 2, 4 and 8 on the tiny-s0 fixture model, without speculation and with
// DSpark at a given per-draft acceptance (the tiny model's random-weight drafter is never right,
// so a scripted drafter proposes the true continuation and errs at the chosen rate).
// Usage: bench_spec [acceptance=0.7] [tokens=24]. Results: docs/SPECULATIVE.md §6.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <ctime>

#include "../spec/spec_fixture.h"

using namespace dsv41;

namespace {

// Process CPU seconds (all threads) to generate n tokens in each of `batch` sequences: on a
// shared machine the CPU time of the work is far steadier than the wall time.
double seconds(model::CpuModel& m, spec::SpecBackend* backend, int batch, int64_t n, int64_t k) {
  const auto base = test_support::golden_ids("tiny-s0", "prompt_ids");
  sched::SchedulerOptions so;
  so.max_num_seqs = batch;
  so.max_num_batched_tokens = 4096;
  so.kv_cache_gib = 1.0;
  so.spec.method = backend ? spec::SpecMethod::dspark : spec::SpecMethod::none;
  so.spec.max_draft_tokens = k;
  so.spec.adaptive = false;
  sched::Scheduler s(m, so, backend);
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < batch; ++i) {
    sched::GenerationRequest r;
    r.prompt.assign(base.begin() + i, base.end());
    r.max_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    chans.push_back(s.submit(r));
  }
  const std::clock_t t0 = std::clock();
  s.start();
  for (auto& c : chans) test_support::collect_ids(*c);
  s.stop();
  return static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC;
}

// Decode-phase tokens per CPU second: the time of n tokens minus the time of the first one
// (prefill + first sample), best of `reps` runs.
double rate(model::CpuModel& m, spec::SpecBackend* backend, int batch, int64_t n, int64_t k, int reps = 3) {
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const double t1 = seconds(m, backend, batch, 1, k), tn = seconds(m, backend, batch, n, k);
    if (tn > t1) best = std::max(best, static_cast<double>(batch * (n - 1)) / (tn - t1));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const double acceptance = argc > 1 ? std::atof(argv[1]) : 0.7;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 24;
  auto m = test_support::load_tiny("tiny-s0");
  const auto base = test_support::golden_ids("tiny-s0", "prompt_ids");
  test_support::ScriptedDrafter::Truth truth;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p(base.begin() + i, base.end());
    auto full = p;
    const auto ref = test_support::engine_greedy(*m, p, n);
    full.insert(full.end(), ref.begin(), ref.end());
    truth[static_cast<int64_t>(p.size())] = full;
  }
  // Wrong with probability 1 - acceptance, decided by a fixed hash of the position.
  test_support::ScriptedDrafter scripted(*m, truth, [acceptance](int64_t len, int64_t pos) {
    const uint64_t h = (static_cast<uint64_t>(len) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(pos) * 0xC2B2AE3D27D4EB4Full);
    return static_cast<double>((h >> 11) % 1000) / 1000.0 >= acceptance;
  });
  auto own = spec::make_cpu_spec_backend(*m);
  fmt::print("tiny-s0, {} tokens per sequence, decode-phase tokens per CPU second (best of 3)\n", n);
  fmt::print("{:>5} {:>10} {:>16} {:>22}\n", "batch", "no spec", "own drafter k=2",
             fmt::format("scripted {:.0f}% k=2", acceptance * 100));
  for (int b : {1, 2, 4}) {
    const double none = rate(*m, nullptr, b, n, 0);
    const double mine = rate(*m, own.get(), b, n, 2);
    const double scr = rate(*m, &scripted, b, n, 2);
    fmt::print("{:>5} {:>10.1f} {:>16.1f} {:>22.1f}\n", b, none, mine, scr);
  }
  return 0;
}
