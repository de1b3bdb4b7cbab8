// A served API on the rule test double and the byte-level test vocabulary, in-process (call
// api->handle) or on a real socket (127.0.0.1, ephemeral port).
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "dsv41/serve/http.h"
#include "sched/scheduler.h"
#include "serve/api.h"
#include "serve/text_backend_impl.h"
#include "test_model.h"
#include "test_tokenizer.h"

namespace dsv41::test_support {

struct ServedRuleModel {
  explicit ServedRuleModel(sched::SchedulerOptions so = {}, serve::ApiOptions ao = {}, bool socket = false,
                           serve::HttpServerOptions ho = {}) {
    text = std::make_unique<serve::TokenizerTextBackend>(text::Tokenizer::from_json_text(test_tokenizer_json()));
    ModelConfig cfg = tiny_config();
    // Chat prompts of the byte-level vocabulary are long: a test may ask for more context.
    if (so.max_model_len > cfg.max_position_embeddings) cfg.max_position_embeddings = so.max_model_len;
    model = std::make_unique<RuleModel>(cfg);
    model->anchor = kTestAssistant;
    model->token_bytes = [t = text.get()](int32_t id) { return t->token_bytes(id); };
    if (so.max_num_batched_tokens == 512) so.max_num_batched_tokens = 128;
    sched = std::make_unique<sched::Scheduler>(*model, so);
    if (ao.model_names.empty()) ao.model_names = {"tiny"};
    ao.keepalive_ms = 100;
    api = std::make_unique<serve::Api>(*sched, *text, ao);
    sched->start();
    if (socket) {
      ho.port = 0;
      http = std::make_unique<serve::HttpServer>(ho, [a = api.get()](const serve::HttpRequest& r) { return a->handle(r); });
      http->start();
    }
  }
  ~ServedRuleModel() {
    sched->stop();
    if (http) http->stop();
  }
  // Scripts the model's answer for prompts containing `key` (text encoded with the test vocab).
  void script(const std::string& key, const std::string& output) {
    model->scripts.emplace_back(key, text->encode(output));
  }
  serve::HttpResponse call(const std::string& method, const std::string& path, const std::string& body,
                           std::vector<std::pair<std::string, std::string>> headers = {}) {
    serve::HttpRequest r;
    r.method = method;
    r.path = path;
    r.body = body;
    r.headers = std::move(headers);
    return api->handle(r);
  }
  // Runs a response's stream producer to the end (or until `max_writes` writes, then "disconnects").
  static std::string drain(const serve::HttpResponse& r, int max_writes = -1) {
    if (!r.stream) return r.body;
    std::string out;
    int writes = 0;
    r.stream([&](std::string_view s) {
      if (max_writes >= 0 && writes >= max_writes) return false;
      ++writes;
      out += s;
      return true;
    });
    return out;
  }

  std::unique_ptr<serve::TokenizerTextBackend> text;
  std::unique_ptr<RuleModel> model;
  std::unique_ptr<sched::Scheduler> sched;
  std::unique_ptr<serve::Api> api;
  std::unique_ptr<serve::HttpServer> http;
};

}  // namespace dsv41::test_support
