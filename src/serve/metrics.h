// Request-level metrics kept by the API (latency histograms and counts); engine counters come
// from the scheduler. Rendered as Prometheus text with vLLM's names (CHAT.md §4.5).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dsv41/spec/stats.h"

namespace dsv41::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the `_bucket`, `_sum`, `_count` lines of metric `name` with label set `labels`.
  void render(std::string& out, const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t n_ = 0;
};

struct Metrics {
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram inter_token{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10, 20}};
  Histogram e2e{{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960}};
  Histogram prompt_tokens{{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
                           200000, 500000, 1000000}};
  Histogram generation_tokens{{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}};
  std::mutex mu;
  uint64_t http_errors_4xx = 0, http_errors_5xx = 0, rejected_overload = 0;
};

// Appends the speculative decoding metrics (docs/SPECULATIVE.md §5): vLLM's spec_decode counters,
// the acceptance rate, the mean accepted length and, per draft length k, a histogram of accepted
// drafts. `labels` is the label set of every line (model_name="...").
void render_spec_metrics(std::string& out, const spec::SpecStats& s, const std::string& labels);

}  // namespace dsv41::serve
