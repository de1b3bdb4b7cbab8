// The OpenAI-compatible API: routes, auth, request validation, responses and SSE, on top of the
// scheduler (tokens) and a TextBackend (text). Driven through HttpRequest/HttpResponse values, so
// tests can run it in-process; HttpServer puts it on a socket.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv41/runtime/health.h"
#include "dsv41/runtime/watchdog.h"
#include "dsv41/serve/http.h"
#include "dsv41/serve/text_backend.h"
#include "sched/scheduler.h"
#include "serve/metrics.h"

namespace dsv41::serve {

struct ApiOptions {
  std::vector<std::string> model_names;  // served ids; the first is listed by /v1/models
  std::string api_key;                   // empty: no auth
  int64_t default_max_tokens_chat = 8192;
  int64_t default_max_tokens_thinking = 65536;
  int64_t default_max_tokens_completion = 16;  // OpenAI's legacy default
  int max_n = 16;
  int poll_ms = 20;                   // how often a waiting handler looks at its channel
  int keepalive_ms = 2000;            // idle SSE streams send a comment this often (detects gone clients)
  int retry_after_s = 1;              // Retry-After on 429/503
  // Runtime guards (issue 11), each optional:
  std::function<runtime::Admission()> admission;           // memory watchdog: no -> 503 + its Retry-After
  std::function<runtime::RuntimeHealth()> runtime_health;  // merged into /health; unhealthy -> 503
  std::function<std::string()> extra_metrics;              // appended to /metrics (e.g. the Engram store)
};

class Api {
 public:
  Api(sched::Scheduler& scheduler, const TextBackend& text, ApiOptions o);
  // Never throws: every failure becomes an OpenAI error response.
  HttpResponse handle(const HttpRequest& r) noexcept;
  void set_ready(bool ready) { ready_.store(ready); }
  const ApiOptions& options() const { return opt_; }
  Metrics& metrics() { return *metrics_; }

 private:
  HttpResponse route(const HttpRequest& r);
  HttpResponse models(const HttpRequest& r);
  HttpResponse chat_completions(const HttpRequest& r);
  HttpResponse completions(const HttpRequest& r);
  HttpResponse tokenize(const HttpRequest& r);
  HttpResponse detokenize(const HttpRequest& r);
  HttpResponse metrics_text();
  HttpResponse health();
  std::string check_model(const nlohmann::ordered_json& body) const;

  sched::Scheduler& sched_;
  const TextBackend& text_;
  ApiOptions opt_;
  std::atomic<bool> ready_{true};
  std::shared_ptr<Metrics> metrics_;
};

}  // namespace dsv41::serve
