// Host sampler cost per token over a whole 129,280-entry vocabulary row (DeepSeek-V4.1's head),
// for the request settings a server sees: greedy, the OpenAI default (temperature 1, top_p 1),
// nucleus, top-k, and logprobs. Usage: bench_sampling [tokens per setting = 50].
// Results: bench/RESULTS.md ("Host sampling").
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "dsv41/common/parallel.h"
#include "sched/sampling.h"

using namespace dsv41;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  constexpr int32_t kVocab = 129280;
  std::mt19937 g(1);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<std::vector<float>> rows(8, std::vector<float>(kVocab));
  for (auto& r : rows)
    for (float& v : r) v = logit(g);
  struct Setting {
    const char* name;
    sched::SamplingParams p;
  };
  std::vector<Setting> settings(6);
  settings[0].name = "greedy";
  settings[0].p.temperature = 0;
  settings[1].name = "temperature 1 (OpenAI default)";
  settings[2].name = "temperature 0.7, top_p 0.9";
  settings[2].p.temperature = 0.7;
  settings[2].p.top_p = 0.9;
  settings[3].name = "top_k 50";
  settings[3].p.top_k = 50;
  settings[4].name = "min_p 0.05, presence 0.5";
  settings[4].p.min_p = 0.05;
  settings[4].p.presence_penalty = 0.5;
  settings[5].name = "temperature 1, top_logprobs 5";
  settings[5].p.top_logprobs = 5;
  fmt::print("host sampling, vocabulary {}, {} threads, {} tokens per setting\n", kVocab, num_threads(), n);
  for (auto& st : settings) {
    st.p.has_seed = true;
    st.p.seed = 1;
    sched::Sampler s(st.p, {});
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) s.sample(rows[static_cast<size_t>(i) % rows.size()]);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
    fmt::print("  {:<32} {:8.3f} ms/token\n", st.name, ms);
  }
}
