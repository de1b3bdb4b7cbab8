#include "serve/api.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "dsv41/common/error.h"
#include "text/utf8.h"
#include "serve/api_error.h"
#include "serve/generation.h"
#include "serve/request_params.h"

namespace dsv41::serve {

namespace {

Json parse_body(const HttpRequest& r) {
  Json body;
  try {
    body = Json::parse(r.body);
  } catch (const nlohmann::json::exception& e) {
    throw bad_request(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  return body;
}

HttpResponse json_response(const Json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  return r;
}

// Constant-time comparison: the key check does not leak its prefix length through timing.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::vector<int32_t> token_array(const Json& a, int64_t vocab, const char* param) {
  std::vector<int32_t> ids;
  for (const Json& x : a) {
    if (!x.is_number_integer()) throw bad_request(fmt::format("'{}' must hold integer token ids", param), param);
    const int64_t v = x.get<int64_t>();
    if (v < 0 || v >= vocab) throw bad_request(fmt::format("token id {} is outside the vocabulary (0..{})", v, vocab - 1), param);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace

Api::Api(sched::Scheduler& scheduler, const TextBackend& text, ApiOptions o)
    : sched_(scheduler), text_(text), opt_(std::move(o)), metrics_(std::make_shared<Metrics>()) {
  DSV_CHECK(!opt_.model_names.empty(), "the API needs at least one served model name");
}

HttpResponse Api::handle(const HttpRequest& r) noexcept {
  HttpResponse res;
  try {
    try {
      res = route(r);
    } catch (const ApiError&) {
      throw;
    } catch (const nlohmann::json::exception& e) {
      // A field of an unexpected type deep inside a message: the client's fault.
      throw bad_request(fmt::format("invalid request: {}", e.what()));
    } catch (const std::bad_alloc&) {
      throw ApiError(503, "the server is out of memory; retry later", "service_unavailable", "", "overloaded");
    } catch (const std::exception& e) {
      spdlog::error("{} {} failed: {}", r.method, r.path, e.what());
      throw ApiError(500, "internal server error", "internal_server_error");
    }
  } catch (const ApiError& e) {
    try {
      res = error_response(e, e.retry_after_s > 0 ? e.retry_after_s : opt_.retry_after_s);
      std::lock_guard lk(metrics_->mu);
      (e.status >= 500 ? metrics_->http_errors_5xx : metrics_->http_errors_4xx)++;
    } catch (...) {
      res = HttpResponse{};
      res.status = 500;
      res.body = R"({"error":{"message":"internal server error","type":"internal_server_error","param":null,"code":500}})";
    }
  } catch (...) {
    res = HttpResponse{};
    res.status = 500;
    res.body = R"({"error":{"message":"internal server error","type":"internal_server_error","param":null,"code":500}})";
  }
  return res;
}

HttpResponse Api::route(const HttpRequest& r) {
  const std::string& p = r.path;
  if (p == "/health") return health();
  if (!opt_.api_key.empty()) {
    std::string auth = r.header("Authorization");
    std::string key;
    if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
    else key = r.header("x-api-key");
    if (key.empty() || !same_secret(key, opt_.api_key))
      throw ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "authentication_error", "",
                     "invalid_api_key");
  }
  auto method = [&](const char* m) {
    if (r.method != m) throw ApiError(405, fmt::format("{} needs {}", p, m), "invalid_request_error", "", "method_not_allowed");
  };
  if (p == "/v1/chat/completions" || p == "/v1/completions") {
    method("POST");
    if (opt_.admission) {
      // Below the memory margin new work is refused before it takes any memory.
      const runtime::Admission a = opt_.admission();
      if (!a.admit) {
        {
          std::lock_guard lk(metrics_->mu);
          ++metrics_->rejected_overload;
        }
        ApiError e(503, fmt::format("the server is low on memory ({}); retry later", a.reason), "service_unavailable",
                   "", "low_memory");
        e.retry_after_s = a.retry_after_s;
        throw e;
      }
    }
    return p == "/v1/completions" ? completions(r) : chat_completions(r);
  }
  if (p == "/v1/models" || p.rfind("/v1/models/", 0) == 0) return method("GET"), models(r);
  if (p == "/metrics") return method("GET"), metrics_text();
  if (p == "/tokenize") return method("POST"), tokenize(r);
  if (p == "/detokenize") return method("POST"), detokenize(r);
  throw ApiError(404, fmt::format("no route {} {}", r.method, p), "not_found_error", "", "not_found");
}

HttpResponse Api::health() {
  Json body = {{"status", "ok"}};
  bool healthy = ready_.load() && sched_.stats().healthy;
  if (opt_.runtime_health) {
    // Stall detector (unhealthy -> 503) and memory watchdog (reported; admission is per request).
    const runtime::RuntimeHealth h = opt_.runtime_health();
    healthy = healthy && h.healthy;
    for (auto it = h.detail.begin(); it != h.detail.end(); ++it) body[it.key()] = Json::parse(it.value().dump());
  }
  if (!healthy) {
    body["status"] = ready_.load() ? "unhealthy" : "unavailable";
    HttpResponse r = json_response(body, 503);
    r.headers.emplace_back("Retry-After", std::to_string(opt_.retry_after_s));
    return r;
  }
  return json_response(body);
}

HttpResponse Api::models(const HttpRequest& r) {
  const int64_t created = 0;
  auto card = [&](const std::string& id) {
    return Json{{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "dsv41-serve"},
                {"root", opt_.model_names.front()}, {"max_model_len", sched_.max_model_len()}};
  };
  if (r.path.size() > std::string("/v1/models/").size()) {
    const std::string id = r.path.substr(std::string("/v1/models/").size());
    for (auto& n : opt_.model_names)
      if (n == id) return json_response(card(n));
    throw ApiError(404, fmt::format("the model '{}' does not exist", id), "invalid_request_error", "model", "model_not_found");
  }
  Json data = Json::array();
  for (auto& n : opt_.model_names) data.push_back(card(n));
  return json_response({{"object", "list"}, {"data", data}});
}

std::string Api::check_model(const Json& body) const {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return opt_.model_names.front();
  if (!it->is_string()) throw bad_request("'model' must be a string", "model");
  const std::string m = it->get<std::string>();
  for (auto& n : opt_.model_names)
    if (n == m) return m;
  throw ApiError(404, fmt::format("the model '{}' does not exist", m), "invalid_request_error", "model", "model_not_found");
}

namespace {

// Resolves the generation limit: an explicit max_tokens must fit the context with the prompt;
// the default is capped by what is left of the context.
int64_t resolve_max_tokens(int64_t requested, int64_t dflt, int64_t prompt_len, int64_t max_model_len) {
  if (prompt_len >= max_model_len)
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens, "
                                  "which leaves no room for output. Please reduce the length of the prompt.",
                                  max_model_len, prompt_len),
                      "messages", "context_length_exceeded");
  if (requested < 0) return std::min(dflt, max_model_len - prompt_len);
  if (requested > max_model_len - prompt_len)
    throw bad_request(fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                  "({} in the prompt, {} for the completion). Please reduce the length of the prompt "
                                  "or the completion.",
                                  max_model_len, prompt_len + requested, prompt_len, requested),
                      "max_tokens", "context_length_exceeded");
  return requested;
}

}  // namespace

HttpResponse Api::chat_completions(const HttpRequest& r) {
  Json body = parse_body(r);
  GenerationSpec spec;
  spec.chat = true;
  spec.model = check_model(body);
  const int64_t vocab = sched_.config().vocab_size;
  spec.params = parse_generation_params(body, true, vocab, opt_.max_n);
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw bad_request("'messages' must be a non-empty list", "messages");

  // tool_choice: "none" renders no tools and parses none; "auto", "required" and a named
  // function parse calls (no grammar-constrained decoding: required/named are best effort).
  bool tools_on = body.contains("tools") && !body["tools"].is_null();
  if (tools_on && !body["tools"].is_array()) throw bad_request("'tools' must be a list", "tools");
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      const std::string v = tc.get<std::string>();
      if (v == "none") tools_on = false;
      else if (v != "auto" && v != "required") throw bad_request("'tool_choice' must be none, auto, required or a function", "tool_choice");
    } else if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name")) {
      throw bad_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
    }
  }
  spec.parallel_tool_calls = get_bool(body, "parallel_tool_calls", true);
  Json render = body;
  if (!tools_on) render.erase("tools");
  spec.parse_tools = tools_on && !body["tools"].empty();

  ChatPrompt prompt;
  try {
    prompt = text_.render_chat(render);
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
  ChoiceInput in;
  in.prompt = std::move(prompt.ids);
  in.thinking = prompt.thinking;
  const int64_t dflt = in.thinking ? opt_.default_max_tokens_thinking : opt_.default_max_tokens_chat;
  spec.max_tokens = resolve_max_tokens(spec.params.max_tokens, dflt, static_cast<int64_t>(in.prompt.size()), sched_.max_model_len());
  spec.prompts.push_back(std::move(in));
  return run_generation(std::move(spec), sched_, text_, opt_, metrics_, r.client_gone);
}

HttpResponse Api::completions(const HttpRequest& r) {
  Json body = parse_body(r);
  GenerationSpec spec;
  spec.chat = false;
  spec.model = check_model(body);
  const int64_t vocab = sched_.config().vocab_size;
  spec.params = parse_generation_params(body, false, vocab, opt_.max_n);
  if (body.contains("suffix") && !body["suffix"].is_null()) throw bad_request("'suffix' is not supported", "suffix");
  const bool echo = get_bool(body, "echo", false);
  if (!body.contains("prompt") || body["prompt"].is_null()) throw bad_request("'prompt' is required", "prompt");
  const Json& pj = body["prompt"];
  std::vector<std::vector<int32_t>> prompts;
  if (pj.is_string()) {
    prompts.push_back(text_.encode(pj.get<std::string>()));
  } else if (pj.is_array() && !pj.empty() && pj[0].is_number()) {
    prompts.push_back(token_array(pj, vocab, "prompt"));
  } else if (pj.is_array() && !pj.empty()) {
    if (pj.size() > 64) throw bad_request("'prompt' holds at most 64 prompts", "prompt");
    for (const Json& x : pj) {
      if (x.is_string()) prompts.push_back(text_.encode(x.get<std::string>()));
      else if (x.is_array()) prompts.push_back(token_array(x, vocab, "prompt"));
      else throw bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of those", "prompt");
    }
  } else {
    throw bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of those", "prompt");
  }
  int64_t longest = 0;
  for (auto& p : prompts) {
    if (p.empty()) throw bad_request("'prompt' must not be empty", "prompt");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  }
  spec.max_tokens = resolve_max_tokens(spec.params.max_tokens, opt_.default_max_tokens_completion, longest, sched_.max_model_len());
  for (auto& p : prompts) {
    ChoiceInput in;
    if (echo) {
      std::string t;
      for (int32_t id : p) t += text_.token_bytes(id);
      in.echo_text = text::utf8::decode_lossy(t);
    }
    in.prompt = std::move(p);
    spec.prompts.push_back(std::move(in));
  }
  return run_generation(std::move(spec), sched_, text_, opt_, metrics_, r.client_gone);
}

HttpResponse Api::tokenize(const HttpRequest& r) {
  Json body = parse_body(r);
  check_model(body);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    Json render = body;
    if (!render.contains("add_generation_prompt")) render["add_generation_prompt"] = true;
    try {
      ids = text_.render_chat(render).ids;
    } catch (const Error& e) {
      throw bad_request(e.what(), "messages");
    }
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    ids = text_.encode(body["prompt"].get<std::string>());
  } else {
    throw bad_request("/tokenize needs 'prompt' (a string) or 'messages'", "prompt");
  }
  Json out;
  out["count"] = ids.size();
  out["max_model_len"] = sched_.max_model_len();
  out["tokens"] = ids;
  if (get_bool(body, "return_token_strs", false)) {
    Json strs = Json::array();
    for (int32_t id : ids) strs.push_back(text::utf8::decode_lossy(text_.token_bytes(id)));
    out["token_strs"] = strs;
  }
  return json_response(out);
}

HttpResponse Api::detokenize(const HttpRequest& r) {
  Json body = parse_body(r);
  check_model(body);
  if (!body.contains("tokens") || !body["tokens"].is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
  auto ids = token_array(body["tokens"], sched_.config().vocab_size, "tokens");
  std::string text;
  for (int32_t id : ids) text += text_.token_bytes(id);
  return json_response({{"prompt", text::utf8::decode_lossy(text)}});
}

HttpResponse Api::metrics_text() {
  const auto s = sched_.stats();
  const std::string lbl = fmt::format("model_name=\"{}\"", opt_.model_names.front());
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0}{{{2}}} {3}\n", name, help, lbl, v);
  };
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0}{{{2}}} {3}\n", name, help, lbl, v);
  };
  gauge("vllm:num_requests_running", "Sequences in the running batch.", static_cast<double>(s.running));
  gauge("vllm:num_requests_waiting", "Sequences waiting for admission.", static_cast<double>(s.waiting));
  gauge("vllm:kv_cache_usage_perc", "Fraction of the sequence-state pool in use (1 = full).", s.kv_usage);
  counter("vllm:prompt_tokens_total", "Prompt tokens prefilled.", s.prompt_tokens_total);
  counter("vllm:generation_tokens_total", "Tokens generated.", s.generation_tokens_total);
  counter("vllm:num_preemptions_total", "Sequences preempted (state recomputed later).", s.preemptions_total);
  out += "# HELP vllm:request_success_total Finished sequences by finish reason.\n# TYPE vllm:request_success_total counter\n";
  out += fmt::format("vllm:request_success_total{{{},finished_reason=\"stop\"}} {}\n", lbl, s.finished_stop);
  out += fmt::format("vllm:request_success_total{{{},finished_reason=\"length\"}} {}\n", lbl, s.finished_length);
  out += fmt::format("vllm:request_success_total{{{},finished_reason=\"abort\"}} {}\n", lbl, s.finished_abort);
  counter("dsv41:request_errors_total", "Sequences that failed inside the engine.", s.finished_error);
  counter("dsv41:engine_iterations_total", "Engine steps (one batched forward each).", s.iterations_total);
  counter("dsv41:iteration_tokens_total", "Tokens processed by all engine steps.", s.iteration_tokens_total);
  gauge("dsv41:state_pool_used_bytes", "Bytes of the sequence-state pool held by live sequences.", static_cast<double>(s.pool_used_bytes));
  gauge("dsv41:state_pool_capacity_bytes", "Capacity of the sequence-state pool (--kv-cache-gib).", static_cast<double>(s.pool_capacity_bytes));
  gauge("dsv41:state_pool_peak_bytes", "Most bytes the sequence-state pool has held.", static_cast<double>(s.pool_peak_bytes));
  gauge("dsv41:live_sequence_states", "Sequence states currently allocated.", static_cast<double>(s.live_states));
  {
    std::lock_guard lk(metrics_->mu);
    counter("dsv41:http_client_errors_total", "Requests answered with a 4xx error.", static_cast<int64_t>(metrics_->http_errors_4xx));
    counter("dsv41:http_server_errors_total", "Requests answered with a 5xx error.", static_cast<int64_t>(metrics_->http_errors_5xx));
    counter("dsv41:requests_rejected_total", "Requests refused because the server was overloaded.", static_cast<int64_t>(metrics_->rejected_overload));
  }
  render_spec_metrics(out, s.spec, lbl);
  metrics_->ttft.render(out, "vllm:time_to_first_token_seconds", "Time to the first generated token.", lbl);
  metrics_->inter_token.render(out, "vllm:inter_token_latency_seconds", "Time between generated tokens.", lbl);
  metrics_->e2e.render(out, "vllm:e2e_request_latency_seconds", "Request latency.", lbl);
  metrics_->prompt_tokens.render(out, "vllm:request_prompt_tokens", "Prompt tokens per request.", lbl);
  metrics_->generation_tokens.render(out, "vllm:request_generation_tokens", "Generated tokens per choice.", lbl);
  if (opt_.extra_metrics) out += opt_.extra_metrics();
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = std::move(out);
  return r;
}

}  // namespace dsv41::serve
