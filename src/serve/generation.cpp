#include "serve/generation.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <random>

#include "dsv41/common/error.h"
#include "text/utf8.h"

namespace dsv41::serve {

namespace {

using Clock = std::chrono::steady_clock;

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = digits[rng() & 15];
  return s;
}

struct ToolCallAcc {
  std::string id, name, arguments;
};

struct Choice {
  int index = 0;
  std::shared_ptr<sched::TokenChannel> ch;
  std::unique_ptr<ChoiceOutput> text;
  bool finished = false;       // channel closed and text flushed
  bool started = false;        // first chunk (role) sent
  std::string reason;          // OpenAI finish_reason
  bool failed = false;
  std::vector<int32_t> token_ids;
  std::vector<sched::SampledToken> counted;  // tokens that count (for logprobs)
  std::string reasoning, content;
  std::map<int, ToolCallAcc> calls;
  Clock::time_point last_token;
  bool got_first = false;
};

class Generation {
 public:
  Generation(GenerationSpec spec, sched::Scheduler& sched, const TextBackend& text, const ApiOptions& opt,
             std::shared_ptr<Metrics> metrics)
      : spec_(std::move(spec)), sched_(sched), text_(text), opt_(opt), metrics_(std::move(metrics)) {
    id_ = (spec_.chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    start_ = Clock::now();
  }

  ~Generation() {
    for (auto& c : choices_)
      if (c.ch) c.ch->cancel();  // a handler that returns early never leaves work running
  }

  void submit() {
    const auto& p = spec_.params;
    int index = 0;
    for (const auto& in : spec_.prompts) {
      for (int j = 0; j < p.n; ++j) {
        sched::GenerationRequest r;
        r.prompt = in.prompt;
        r.sampling = p.sampling;
        if (r.sampling.has_seed) r.sampling.seed += static_cast<uint64_t>(j);  // distinct but reproducible choices
        r.max_tokens = spec_.max_tokens;
        r.min_tokens = p.min_tokens;
        r.ignore_eos = p.ignore_eos;
        r.stop_token_ids = p.stop_token_ids;
        Choice c;
        c.index = index++;
        OutputOptions oo;
        oo.parse_markup = spec_.chat;
        oo.thinking = in.thinking;
        oo.parse_tools = spec_.parse_tools;
        oo.stop = p.stop;
        oo.include_stop = p.include_stop_str_in_output;
        oo.ignore_eos = p.ignore_eos;
        // The scheduler ends a sequence on the model's EOS and the stop ids and delivers that token
        // last; the text side treats the same ids as the end (counted, no text).
        oo.stop_token_ids = p.stop_token_ids;
        if (!p.ignore_eos) oo.stop_token_ids.push_back(static_cast<int32_t>(sched_.config().eos_token_id));
        c.text = text_.new_output(oo);
        try {
          c.ch = sched_.submit(std::move(r));
        } catch (const sched::Overloaded& e) {
          metrics_->mu.lock();
          ++metrics_->rejected_overload;
          metrics_->mu.unlock();
          const bool full = std::string(e.what()).find("waiting") != std::string::npos;
          throw ApiError(full ? 429 : 503, fmt::format("the server is overloaded: {}; retry later", e.what()),
                         full ? "rate_limit_error" : "service_unavailable", "", full ? "rate_limit_exceeded" : "overloaded");
        } catch (const Error& e) {
          const std::string msg = e.what();
          throw bad_request(msg, "messages", msg.find("maximum context length") != std::string::npos ? "context_length_exceeded" : "");
        }
        c.last_token = Clock::now();
        if (!in.echo_text.empty()) c.content = in.echo_text;
        prompt_tokens_ += static_cast<int64_t>(in.prompt.size());
        choices_.push_back(std::move(c));
      }
    }
  }

  // Takes what the channels have; returns the deltas per choice (index-aligned) and whether
  // every choice is finished.
  struct Step {
    std::vector<ParsedDelta> deltas;
    std::vector<std::vector<sched::SampledToken>> tokens;  // counted tokens of this step
    std::vector<bool> just_finished;
  };

  bool poll(Step& st, std::chrono::milliseconds wait) {
    st.deltas.assign(choices_.size(), {});
    st.tokens.assign(choices_.size(), {});
    st.just_finished.assign(choices_.size(), false);
    bool all = true, waited = false;
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (c.finished) continue;
      std::vector<sched::SampledToken> got;
      const bool closed = c.ch->wait(got, waited ? std::chrono::milliseconds(0) : wait);
      waited = true;
      for (auto& t : got) {
        if (c.text->stopped()) break;
        const auto now = Clock::now();
        if (!c.got_first) {
          metrics_->ttft.observe(std::chrono::duration<double>(now - start_).count());
          c.got_first = true;
        } else {
          metrics_->inter_token.observe(std::chrono::duration<double>(now - c.last_token).count());
        }
        c.last_token = now;
        ParsedDelta d = c.text->push(t.id);
        merge(st.deltas[i], std::move(d));
        c.token_ids.push_back(t.id);
        st.tokens[i].push_back(t);
        if (spec_.params.logprobs) c.counted.push_back(t);
        if (c.text->stopped()) {
          c.ch->cancel();
          c.reason = "stop";
        }
      }
      if (closed || c.text->stopped()) {
        if (closed || c.ch->finish_reason() != sched::FinishReason::none || c.text->stopped()) {
          merge(st.deltas[i], c.text->finish());
          c.finished = true;
          st.just_finished[i] = true;
          if (c.reason.empty()) {
            auto r = c.ch->finish_reason();
            if (r == sched::FinishReason::length) c.reason = "length";
            else if (r == sched::FinishReason::stop) c.reason = "stop";
            else c.failed = true;
          }
        }
      }
      // Accumulate (non-stream body, tool-call bookkeeping, usage).
      accumulate(c, st.deltas[i]);
      if (c.finished && !c.failed && c.reason == "stop" && !c.calls.empty()) c.reason = "tool_calls";
      all = all && c.finished;
    }
    return all;
  }

  void cancel_all() {
    for (auto& c : choices_)
      if (c.ch) c.ch->cancel();
  }

  bool any_failed() const {
    for (auto& c : choices_)
      if (c.failed) return true;
    return false;
  }

  // What a failed request answers: 503 naming the rank when a tensor-parallel rank is down (the
  // scheduler passes that message on), else a plain 500.
  ApiError failure() const {
    for (auto& c : choices_)
      if (c.failed && c.ch->error().rfind("tensor-parallel", 0) == 0)
        return ApiError(503, c.ch->error(), "service_unavailable", "", "rank_unavailable");
    // The engine stalled (the stall detector failed every open request): 503 with the reason.
    for (auto& c : choices_)
      if (c.failed && c.ch->retryable()) return ApiError(503, c.ch->error(), "service_unavailable", "", "engine_stalled");
    return ApiError(500, "internal error while generating", "internal_server_error");
  }

  void record_metrics() {
    metrics_->e2e.observe(std::chrono::duration<double>(Clock::now() - start_).count());
    for (const auto& in : spec_.prompts) metrics_->prompt_tokens.observe(static_cast<double>(in.prompt.size()));
    for (auto& c : choices_) metrics_->generation_tokens.observe(static_cast<double>(c.text->completion_tokens()));
  }

  Json usage() const {
    int64_t completion = 0, reasoning = 0;
    for (auto& c : choices_) {
      completion += c.text->completion_tokens();
      reasoning += c.text->reasoning_tokens();
    }
    Json u;
    u["prompt_tokens"] = prompt_tokens_;
    u["completion_tokens"] = completion;
    u["total_tokens"] = prompt_tokens_ + completion;
    u["prompt_tokens_details"] = {{"cached_tokens", 0}};
    u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
    return u;
  }

  Json header(const char* object) const {
    Json j;
    j["id"] = id_;
    j["object"] = object;
    j["created"] = created_;
    j["model"] = spec_.model;
    return j;
  }

  Json token_logprob(const sched::SampledToken& t) const {
    Json e;
    const std::string b = text_.token_bytes(t.id);
    e["token"] = text::utf8::decode_lossy(b);
    e["logprob"] = t.logprob;
    Json bytes = Json::array();
    for (unsigned char ch : b) bytes.push_back(static_cast<int>(ch));
    e["bytes"] = bytes;
    Json top = Json::array();
    for (auto& [id, lp] : t.top) {
      const std::string tb = text_.token_bytes(id);
      Json bt = Json::array();
      for (unsigned char ch : tb) bt.push_back(static_cast<int>(ch));
      top.push_back({{"token", text::utf8::decode_lossy(tb)}, {"logprob", lp}, {"bytes", bt}});
    }
    e["top_logprobs"] = top;
    return e;
  }

  Json chat_logprobs(const std::vector<sched::SampledToken>& toks) const {
    if (!spec_.params.logprobs) return nullptr;
    Json content = Json::array();
    for (auto& t : toks) content.push_back(token_logprob(t));
    return {{"content", content}};
  }

  // Legacy completions logprobs: parallel arrays.
  Json completion_logprobs(const std::vector<sched::SampledToken>& toks, int64_t& offset) const {
    if (!spec_.params.logprobs) return nullptr;
    Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
    for (auto& t : toks) {
      const std::string b = text_.token_bytes(t.id);
      tokens.push_back(text::utf8::decode_lossy(b));
      lps.push_back(t.logprob);
      Json top = Json::object();
      for (auto& [id, lp] : t.top) top[text::utf8::decode_lossy(text_.token_bytes(id))] = lp;
      tops.push_back(top);
      offs.push_back(offset);
      offset += static_cast<int64_t>(b.size());
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }

  Json delta_json(const ParsedDelta& d, Choice& c, bool first) const {
    Json delta = Json::object();
    if (first) {
      delta["role"] = "assistant";
      delta["content"] = "";
    }
    if (!d.reasoning.empty()) {
      delta["reasoning_content"] = d.reasoning;
      delta["reasoning"] = d.reasoning;
    }
    if (!d.content.empty()) delta["content"] = d.content;
    Json calls = Json::array();
    for (auto& tc : d.tool_calls) {
      if (!spec_.parallel_tool_calls && tc.index > 0) continue;
      Json x;
      x["index"] = tc.index;
      if (!tc.id.empty()) {
        x["id"] = tc.id;
        x["type"] = "function";
      }
      Json fn = Json::object();
      if (!tc.name.empty()) fn["name"] = tc.name;
      fn["arguments"] = tc.arguments;
      x["function"] = fn;
      calls.push_back(x);
    }
    if (!calls.empty()) delta["tool_calls"] = calls;
    return delta;
  }

  HttpResponse body_response(const std::function<bool()>& client_gone) {
    Step st;
    while (!poll(st, std::chrono::milliseconds(opt_.poll_ms))) {
      if (client_gone && client_gone()) {
        // Nobody will read the answer: free the sequences now.
        cancel_all();
        HttpResponse r;
        r.status = 499;
        r.body = R"({"error":{"message":"client closed the connection","type":"invalid_request_error","param":null,"code":499}})";
        return r;
      }
    }
    record_metrics();
    if (any_failed()) throw failure();
    Json out = header(spec_.chat ? "chat.completion" : "text_completion");
    Json arr = Json::array();
    for (auto& c : choices_) {
      Json ch;
      ch["index"] = c.index;
      if (spec_.chat) {
        Json msg;
        msg["role"] = "assistant";
        msg["content"] = c.content.empty() ? Json(nullptr) : Json(c.content);
        msg["reasoning_content"] = c.reasoning.empty() ? Json(nullptr) : Json(c.reasoning);
        msg["reasoning"] = msg["reasoning_content"];
        if (!c.calls.empty()) {
          Json calls = Json::array();
          for (auto& [i, tc] : c.calls)
            calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
          msg["tool_calls"] = calls;
        }
        ch["message"] = msg;
        ch["logprobs"] = chat_logprobs(c.counted);
      } else {
        ch["text"] = c.content;
        int64_t off = 0;
        ch["logprobs"] = completion_logprobs(c.counted, off);
      }
      ch["finish_reason"] = c.reason;
      if (spec_.params.return_token_ids) ch["token_ids"] = c.token_ids;
      arr.push_back(ch);
    }
    out["choices"] = arr;
    out["usage"] = usage();
    HttpResponse r;
    r.body = out.dump(-1, ' ', false, Json::error_handler_t::replace);
    return r;
  }

  // The SSE producer. Returns when every choice finished, the client left, or on error.
  void stream(const BodyWriter& write, const std::function<bool()>& client_gone) {
    auto send = [&](const Json& j) { return write("data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n"); };
    const bool usage_on = spec_.params.include_usage;
    auto chunk = [&](Json choices) {
      Json j = header(spec_.chat ? "chat.completion.chunk" : "text_completion");
      j["choices"] = std::move(choices);
      if (usage_on) j["usage"] = nullptr;
      return j;
    };
    // Chat: the role chunk first, for every choice.
    if (spec_.chat) {
      Json arr = Json::array();
      for (auto& c : choices_) {
        arr.push_back({{"index", c.index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
        c.started = true;
      }
      if (!send(chunk(arr))) return cancel_all();
    }
    std::vector<int64_t> offsets(choices_.size(), 0);
    // Completions with echo: the prompt text first.
    if (!spec_.chat) {
      Json arr = Json::array();
      for (auto& c : choices_)
        if (!c.content.empty()) arr.push_back({{"index", c.index}, {"text", c.content}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
      if (!arr.empty() && !send(chunk(arr))) return cancel_all();
    }
    auto last_write = Clock::now();
    Step st;
    bool done = false;
    while (!done) {
      done = poll(st, std::chrono::milliseconds(opt_.poll_ms));
      if (!done && client_gone && client_gone()) return cancel_all();
      Json arr = Json::array();
      Json finals = Json::array();
      for (size_t i = 0; i < choices_.size(); ++i) {
        Choice& c = choices_[i];
        const ParsedDelta& d = st.deltas[i];
        if (c.failed && st.just_finished[i]) {
          // Mid-stream failure: one error event, then close.
          const ApiError f = failure();
          send(Json{{"error", error_json(f.status, f.what(), f.type, "", f.code)["error"]}});
          cancel_all();
          return;
        }
        const bool has = !d.empty() || !st.tokens[i].empty();
        if (has) {
          Json x;
          x["index"] = c.index;
          if (spec_.chat) {
            x["delta"] = delta_json(d, c, false);
            x["logprobs"] = chat_logprobs(st.tokens[i]);
          } else {
            x["text"] = d.content;
            x["logprobs"] = completion_logprobs(st.tokens[i], offsets[i]);
          }
          x["finish_reason"] = nullptr;
          if (spec_.params.return_token_ids) {
            Json ids = Json::array();
            for (auto& t : st.tokens[i]) ids.push_back(t.id);
            x["token_ids"] = ids;
          }
          if (spec_.chat && x["delta"].empty() && x["logprobs"].is_null()) {
            // a token that only moved text into a held-back tail: nothing to show yet
          } else {
            arr.push_back(x);
          }
        }
        if (st.just_finished[i]) {
          Json f;
          f["index"] = c.index;
          if (spec_.chat)
            f["delta"] = Json::object();
          else
            f["text"] = "";
          f["logprobs"] = nullptr;
          f["finish_reason"] = c.reason;
          finals.push_back(f);
        }
      }
      if (!arr.empty()) {
        if (!send(chunk(arr))) return cancel_all();
        last_write = Clock::now();
      }
      if (!finals.empty()) {
        if (!send(chunk(finals))) return cancel_all();
        last_write = Clock::now();
      }
      if (!done && Clock::now() - last_write > std::chrono::milliseconds(opt_.keepalive_ms)) {
        // An SSE comment: ignored by clients, fails once the client is gone.
        if (!write(": keep-alive\n\n")) return cancel_all();
        last_write = Clock::now();
      }
    }
    record_metrics();
    if (usage_on) {
      Json j = header(spec_.chat ? "chat.completion.chunk" : "text_completion");
      j["choices"] = Json::array();
      j["usage"] = usage();
      if (!send(j)) return;
    }
    write("data: [DONE]\n\n");
  }

 private:
  static void merge(ParsedDelta& a, ParsedDelta&& b) {
    a.reasoning += b.reasoning;
    a.content += b.content;
    for (auto& c : b.tool_calls) a.tool_calls.push_back(std::move(c));
  }

  void accumulate(Choice& c, const ParsedDelta& d) {
    c.reasoning += d.reasoning;
    c.content += d.content;
    for (auto& tc : d.tool_calls) {
      if (!spec_.parallel_tool_calls && tc.index > 0) continue;
      auto& acc = c.calls[tc.index];
      if (!tc.id.empty()) acc.id = tc.id;
      if (!tc.name.empty()) acc.name = tc.name;
      acc.arguments += tc.arguments;
    }
  }

  GenerationSpec spec_;
  sched::Scheduler& sched_;
  const TextBackend& text_;
  ApiOptions opt_;
  std::shared_ptr<Metrics> metrics_;
  std::string id_;
  int64_t created_ = 0;
  Clock::time_point start_;
  int64_t prompt_tokens_ = 0;
  std::vector<Choice> choices_;
};

}  // namespace

Json error_json(int status, const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  Json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? Json(nullptr) : Json(param);
  e["code"] = code.empty() ? Json(status) : Json(code);
  return Json{{"error", e}};
}

HttpResponse error_response(const ApiError& e, int retry_after_s) {
  HttpResponse r;
  r.status = e.status;
  r.body = error_json(e.status, e.what(), e.type, e.param, e.code).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  return r;
}

HttpResponse run_generation(GenerationSpec spec, sched::Scheduler& sched, const TextBackend& text,
                            const ApiOptions& opt, std::shared_ptr<Metrics> metrics, std::function<bool()> client_gone) {
  const bool stream = spec.params.stream;
  auto gen = std::make_shared<Generation>(std::move(spec), sched, text, opt, std::move(metrics));
  gen->submit();
  if (!stream) return gen->body_response(client_gone);
  HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers.emplace_back("Cache-Control", "no-cache");
  r.stream = [gen, client_gone](const BodyWriter& w) { gen->stream(w, client_gone); };
  return r;
}

}  // namespace dsv41::serve
