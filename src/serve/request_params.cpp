#include "serve/request_params.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace dsv41::serve {

namespace {

bool present(const Json& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

}  // namespace

bool get_bool(const Json& body, const char* key, bool dflt) {
  if (!present(body, key)) return dflt;
  const Json& v = body[key];
  if (!v.is_boolean()) throw bad_request(fmt::format("'{}' must be a boolean", key), key);
  return v.get<bool>();
}

double get_number(const Json& body, const char* key, double dflt, double lo, double hi) {
  if (!present(body, key)) return dflt;
  const Json& v = body[key];
  if (!v.is_number()) throw bad_request(fmt::format("'{}' must be a number", key), key);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, x), key);
  return x;
}

int64_t get_int(const Json& body, const char* key, int64_t dflt, int64_t lo, int64_t hi) {
  if (!present(body, key)) return dflt;
  const Json& v = body[key];
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    x = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                       : static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
             std::fabs(v.get<double>()) < 9e18) {
    x = static_cast<int64_t>(v.get<double>());  // 16.0 is accepted as 16
  } else {
    throw bad_request(fmt::format("'{}' must be an integer", key), key);
  }
  if (x < lo || x > hi) throw bad_request(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, x), key);
  return x;
}

GenerationParams parse_generation_params(const Json& body, bool chat, int64_t vocab, int max_n) {
  GenerationParams g;
  g.stream = get_bool(body, "stream", false);
  if (present(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    g.include_usage = get_bool(so, "include_usage", false);
  }
  g.n = static_cast<int>(get_int(body, "n", 1, 1, max_n));

  const int64_t big = std::numeric_limits<int64_t>::max();
  // max_completion_tokens wins over the older max_tokens.
  if (present(body, "max_completion_tokens"))
    g.max_tokens = get_int(body, "max_completion_tokens", -1, 1, big);
  else
    g.max_tokens = get_int(body, "max_tokens", -1, 1, big);
  g.min_tokens = get_int(body, "min_tokens", 0, 0, big);
  if (g.max_tokens > 0 && g.min_tokens > g.max_tokens)
    throw bad_request("'min_tokens' must not exceed max_tokens", "min_tokens");
  g.ignore_eos = get_bool(body, "ignore_eos", false);
  g.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output", false);
  g.return_token_ids = get_bool(body, "return_token_ids", false);

  if (present(body, "stop")) {
    const Json& s = body["stop"];
    if (s.is_string()) {
      g.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 16) throw bad_request("'stop' holds at most 16 strings", "stop");
      for (const Json& x : s) {
        if (!x.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        g.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    std::erase_if(g.stop, [](const std::string& x) { return x.empty(); });
  }
  if (present(body, "stop_token_ids")) {
    const Json& s = body["stop_token_ids"];
    if (!s.is_array()) throw bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    for (const Json& x : s) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
        throw bad_request(fmt::format("'stop_token_ids' must hold token ids in 0..{}", vocab - 1), "stop_token_ids");
      g.stop_token_ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
  }

  auto& sp = g.sampling;
  sp.temperature = get_number(body, "temperature", 1.0, 0.0, 2.0);
  sp.top_p = get_number(body, "top_p", 1.0, 0.0, 1.0);
  if (sp.top_p <= 0.0) throw bad_request("'top_p' must be in (0, 1]", "top_p");
  sp.top_k = get_int(body, "top_k", 0, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  if (sp.top_k < 0) sp.top_k = 0;  // vLLM: -1 (any value <= 0) disables top-k
  sp.min_p = get_number(body, "min_p", 0.0, 0.0, 1.0);
  sp.repetition_penalty = get_number(body, "repetition_penalty", 1.0, 0.0, 100.0);
  if (sp.repetition_penalty <= 0.0) throw bad_request("'repetition_penalty' must be > 0", "repetition_penalty");
  sp.presence_penalty = get_number(body, "presence_penalty", 0.0, -2.0, 2.0);
  sp.frequency_penalty = get_number(body, "frequency_penalty", 0.0, -2.0, 2.0);
  if (present(body, "seed")) {
    const Json& s = body["seed"];
    if (!s.is_number_integer()) throw bad_request("'seed' must be an integer", "seed");
    sp.has_seed = true;
    sp.seed = s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
  }
  if (present(body, "logit_bias")) {
    const Json& lb = body["logit_bias"];
    if (!lb.is_object()) throw bad_request("'logit_bias' must be an object of token id -> bias", "logit_bias");
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(it.key(), &used);
        if (used != it.key().size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || id >= vocab)
        throw bad_request(fmt::format("'logit_bias' key '{}' is not a token id in 0..{}", it.key(), vocab - 1), "logit_bias");
      if (!it.value().is_number() || std::fabs(it.value().get<double>()) > 100.0)
        throw bad_request("'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
      sp.logit_bias[static_cast<int32_t>(id)] = it.value().get<float>();
    }
  }

  if (chat) {
    g.logprobs = get_bool(body, "logprobs", false);
    g.top_logprobs = static_cast<int>(get_int(body, "top_logprobs", 0, 0, 20));
    if (present(body, "top_logprobs") && !g.logprobs)
      throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  } else if (present(body, "logprobs")) {
    g.logprobs = true;
    g.top_logprobs = static_cast<int>(get_int(body, "logprobs", 0, 0, 20));
  }
  sp.top_logprobs = g.logprobs ? g.top_logprobs : -1;
  return g;
}

}  // namespace dsv41::serve
