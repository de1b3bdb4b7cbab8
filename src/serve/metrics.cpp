#include "serve/metrics.h"

#include <fmt/format.h>

namespace dsv41::serve {

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help,
                       const std::string& labels) const {
  std::lock_guard lk(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, n_);
}

void render_spec_metrics(std::string& out, const spec::SpecStats& s, const std::string& labels) {
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0}{{{2}}} {3}\n", name, help, labels, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0}{{{2}}} {3}\n", name, help, labels, v);
  };
  counter("vllm:spec_decode_num_drafts_total", "Target steps that verified drafts.", s.verify_steps);
  counter("vllm:spec_decode_num_draft_tokens_total", "Draft tokens verified.", s.draft_tokens);
  counter("vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", s.accepted_tokens);
  out += "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted drafts by position in the draft.\n"
         "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t i = 0; i < s.accepted_at_position.size(); ++i)
    out += fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", labels, i,
                       s.accepted_at_position[i]);
  counter("dsv41:spec_decode_fallback_steps_total",
          "Sequence steps decoded without drafts because the batch was wider than --spec-disable-batch-size.",
          s.fallback_steps);
  gauge("dsv41:spec_decode_acceptance_rate", "Accepted / verified draft tokens (0 before any verification).",
        s.acceptance_rate());
  gauge("dsv41:spec_decode_mean_accepted_length",
        "Tokens committed per verify step: accepted drafts plus the target's own token (0 before any).",
        s.mean_accepted_length());
  // One histogram per draft length k over the number of accepted drafts (0 .. k).
  const char* h = "dsv41:spec_decode_accepted_drafts";
  out += fmt::format("# HELP {0} Accepted drafts per verify step, by draft length k.\n# TYPE {0} histogram\n", h);
  for (size_t k = 1; k < s.by_k.size(); ++k) {
    const auto& row = s.by_k[k];
    if (row.empty()) continue;
    int64_t cum = 0, sum = 0;
    for (size_t a = 0; a <= k; ++a) {
      const int64_t n = a < row.size() ? row[a] : 0;
      cum += n;
      sum += n * static_cast<int64_t>(a);
      out += fmt::format("{}_bucket{{{},k=\"{}\",le=\"{}\"}} {}\n", h, labels, k, a, cum);
    }
    out += fmt::format("{}_bucket{{{},k=\"{}\",le=\"+Inf\"}} {}\n", h, labels, k, cum);
    out += fmt::format("{0}_sum{{{1},k=\"{2}\"}} {3}\n{0}_count{{{1},k=\"{2}\"}} {4}\n", h, labels, k, sum, cum);
  }
}

}  // namespace dsv41::serve
