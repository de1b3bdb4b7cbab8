// Speculative decoding settings shared by the server (--spec-*), the generate tool and the
// scheduler (docs/SPECULATIVE.md).
#pragma once
#include <cstdint>
#include <string>

namespace dsv41::spec {

enum class SpecMethod { none, dspark };

// "dspark" / "none"; throws dsv41::Error naming `flag` for anything else.
SpecMethod parse_spec_method(const std::string& s, const std::string& flag = "--spec-method");
const char* spec_method_name(SpecMethod m);

struct SpecOptions {
  SpecMethod method = SpecMethod::none;
  // Drafts per step at most (--spec-tokens); 0 = the drafter's block size. Larger values are
  // clamped to the block size (the drafter cannot see further).
  int64_t max_draft_tokens = 0;
  // true: per-sequence adaptive draft length from the confidence head and the running acceptance
  // (max_draft_tokens is then the ceiling); false: always max_draft_tokens drafts.
  bool adaptive = true;
  // Speculation pauses for a step when more than this many sequences decode in it (verification
  // stops paying once the target forward is compute bound); 0 = never. Seeded sampled requests
  // keep speculating so that their tokens do not depend on what else is running.
  int64_t disable_batch_size = 0;
  // Adaptive length: a draft is verified while the estimated probability that it and every draft
  // before it are accepted stays at or above this.
  double min_chain_prob = 0.3;
};

// Checks the ranges of the numeric options (one clear error each).
void validate(const SpecOptions& o);

}  // namespace dsv41::spec
