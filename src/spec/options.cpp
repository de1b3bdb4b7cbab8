#include "dsv41/spec/options.h"

#include "dsv41/common/error.h"
#include "dsv41/spec/stats.h"

namespace dsv41::spec {

SpecMethod parse_spec_method(const std::string& s, const std::string& flag) {
  if (s == "dspark") return SpecMethod::dspark;
  if (s == "none") return SpecMethod::none;
  fail("{} {}: expected dspark or none", flag, s);
}

const char* spec_method_name(SpecMethod m) { return m == SpecMethod::dspark ? "dspark" : "none"; }

void validate(const SpecOptions& o) {
  DSV_CHECK(o.max_draft_tokens >= 0, "--spec-tokens {}: expected a positive number of draft tokens", o.max_draft_tokens);
  DSV_CHECK(o.disable_batch_size >= 0, "--spec-disable-batch-size {}: expected 0 (never) or a positive batch size",
            o.disable_batch_size);
  DSV_CHECK(o.min_chain_prob >= 0.0 && o.min_chain_prob <= 1.0, "spec min_chain_prob {} outside [0, 1]",
            o.min_chain_prob);
}

void SpecStats::record(int64_t k, int64_t accepted) {
  ++verify_steps;
  draft_tokens += k;
  accepted_tokens += accepted;
  if (static_cast<int64_t>(accepted_at_position.size()) < k) accepted_at_position.resize(static_cast<size_t>(k), 0);
  for (int64_t i = 0; i < accepted; ++i) ++accepted_at_position[static_cast<size_t>(i)];
  if (static_cast<int64_t>(by_k.size()) <= k) by_k.resize(static_cast<size_t>(k + 1));
  auto& row = by_k[static_cast<size_t>(k)];
  if (static_cast<int64_t>(row.size()) <= k) row.resize(static_cast<size_t>(k + 1), 0);
  ++row[static_cast<size_t>(accepted)];
}

}  // namespace dsv41::spec
