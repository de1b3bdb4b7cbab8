// Validation of the request fields shared by /v1/chat/completions and /v1/completions: sampling,
// limits, stop conditions, logprobs, streaming. Every violation is a 400 naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sched/sampling.h"
#include "serve/api_error.h"

namespace dsv41::serve {

struct GenerationParams {
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  int64_t max_tokens = -1;  // -1: not given (a default applies)
  int64_t min_tokens = 0;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool logprobs = false;
  int top_logprobs = 0;
  bool return_token_ids = false;
  sched::SamplingParams sampling;
};

// `chat`: chat semantics (logprobs is a bool + top_logprobs) vs legacy completions (logprobs is
// an int). vocab bounds logit_bias and stop_token_ids.
GenerationParams parse_generation_params(const Json& body, bool chat, int64_t vocab, int max_n);

// Small typed getters: absent or null -> std::nullopt-like defaults; wrong type -> 400.
bool get_bool(const Json& body, const char* key, bool dflt);
double get_number(const Json& body, const char* key, double dflt, double lo, double hi);
int64_t get_int(const Json& body, const char* key, int64_t dflt, int64_t lo, int64_t hi);

}  // namespace dsv41::serve
