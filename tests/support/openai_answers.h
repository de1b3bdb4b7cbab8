// Reading the server's OpenAI-shaped answers in the real-socket tests: each choice of a streamed
// (SSE) answer with its token ids, text, per-chunk pieces and finish reason; the usage chunk; the
// OpenAI error object; one sample of a /metrics series; and a server endpoint that sends its
// bearer token with every request.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../serve/http_client.h"

namespace dsv41::test {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct StreamedChoice {
  std::vector<int32_t> ids;         // token_ids of every chunk (when the request asked for them)
  std::string text;                 // completions: "text"; chat: delta "content"
  std::string reasoning;            // chat: delta "reasoning_content"
  std::string finish_reason;        // "" until a chunk names one
  std::vector<std::string> pieces;  // the non-empty text of each chunk in order: token boundaries
};

struct StreamedAnswer {
  int status = 0;
  size_t events = 0;
  bool done = false;                    // the last event is [DONE]
  std::vector<StreamedChoice> choices;  // by the chunks' "index"
  nlohmann::ordered_json usage;         // the usage chunk's usage (a chunk without choices); null when none
  bool usage_just_before_done = false;  // that chunk is the last one before [DONE]
  nlohmann::ordered_json error;         // an error event's "error" object; null when none
};

inline StreamedAnswer parse_stream(const test_support::HttpResult& r) {
  using J = nlohmann::ordered_json;
  StreamedAnswer a;
  a.status = r.status;
  const std::vector<std::string> events = test_support::sse_events(r.body);
  a.events = events.size();
  a.done = !events.empty() && events.back() == "[DONE]";
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] == "[DONE]") continue;
    const J chunk = J::parse(events[i], nullptr, false);
    if (chunk.is_discarded() || !chunk.is_object()) {
      a.error = J{{"message", "unparsable event: " + events[i]}};
      continue;
    }
    if (chunk.contains("error")) a.error = chunk["error"];
    const bool has_choices = chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty();
    if (!has_choices && chunk.contains("usage") && chunk["usage"].is_object()) {
      a.usage = chunk["usage"];
      a.usage_just_before_done = i + 2 == events.size() && a.done;
    }
    if (!has_choices) continue;
    for (const J& c : chunk["choices"]) {
      const size_t idx = c.contains("index") ? c["index"].get<size_t>() : 0;
      if (a.choices.size() <= idx) a.choices.resize(idx + 1);
      StreamedChoice& out = a.choices[idx];
      std::string piece;
      if (c.contains("text") && c["text"].is_string()) piece = c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].is_object()) {
        const J& d = c["delta"];
        if (d.contains("content") && d["content"].is_string()) piece = d["content"].get<std::string>();
        if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
          out.reasoning += d["reasoning_content"].get<std::string>();
      }
      out.text += piece;
      if (!piece.empty()) out.pieces.push_back(piece);
      if (c.contains("token_ids") && c["token_ids"].is_array())
        for (const J& x : c["token_ids"]) out.ids.push_back(x.get<int32_t>());
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) out.finish_reason = c["finish_reason"];
    }
  }
  return a;
}

// The token ids of choice 0 of a streamed answer (empty when there is none).
inline std::vector<int32_t> streamed_ids(const test_support::HttpResult& r) {
  const StreamedAnswer a = parse_stream(r);
  return a.choices.empty() ? std::vector<int32_t>{} : a.choices[0].ids;
}

// The token ids of choice `choice` of a whole (non-streamed) answer; a failure when it has none.
inline std::vector<int32_t> answer_ids(const test_support::HttpResult& r, size_t choice = 0) {
  using J = nlohmann::ordered_json;
  EXPECT_EQ(r.status, 200) << r.body;
  const J b = J::parse(r.body, nullptr, false);
  if (r.status != 200 || b.is_discarded() || !b.contains("choices") || b["choices"].size() <= choice ||
      !b["choices"][choice].contains("token_ids")) {
    ADD_FAILURE() << "no token_ids in choice " << choice << ": " << r.body;
    return {};
  }
  return b["choices"][choice]["token_ids"].get<std::vector<int32_t>>();
}

// `status` and `body` are an OpenAI error answer: the wanted HTTP status and an "error" object
// with a string message and type, "param" and "code" keys, and `want_code` as code when given.
inline ::testing::AssertionResult is_openai_error(int status, const std::string& body, int want_status,
                                                  const std::string& want_code = {}) {
  using J = nlohmann::ordered_json;
  if (status != want_status)
    return ::testing::AssertionFailure() << "status " << status << " (want " << want_status << "): " << body;
  const J b = J::parse(body, nullptr, false);
  if (b.is_discarded() || !b.is_object() || !b.contains("error") || !b["error"].is_object())
    return ::testing::AssertionFailure() << "no OpenAI error object: " << body;
  const J& e = b["error"];
  if (!e.contains("message") || !e["message"].is_string() || !e.contains("type") || !e["type"].is_string() ||
      !e.contains("param") || !e.contains("code"))
    return ::testing::AssertionFailure() << "error object lacks message/type/param/code: " << body;
  if (!want_code.empty() && !(e["code"].is_string() && e["code"].get<std::string>() == want_code))
    return ::testing::AssertionFailure() << "code is not " << want_code << ": " << body;
  return ::testing::AssertionSuccess();
}

// The value of the first sample of series `name` in Prometheus text whose line also holds `label`
// (e.g. finished_reason="abort"); NaN when there is none.
inline double metric_sample(const std::string& metrics, const std::string& name, const std::string& label = {}) {
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nan("");
}

// A running server on 127.0.0.1:port; `auth` is sent with every request (the bearer header of a
// server started with --api-key, empty otherwise).
struct ServerEndpoint {
  int port = 0;
  Headers auth;

  test_support::HttpResult post(const std::string& path, const nlohmann::ordered_json& body,
                                int timeout_ms = 60000) const {
    return post_raw(path, body.dump(), timeout_ms);
  }
  test_support::HttpResult post_raw(const std::string& path, const std::string& body, int timeout_ms = 60000) const {
    return test_support::http_request(port, "POST", path, body, auth, timeout_ms);
  }
  test_support::HttpResult get(const std::string& path) const {
    return test_support::http_request(port, "GET", path, {}, auth);
  }
  double metric(const std::string& name, const std::string& label = {}) const {
    return metric_sample(get("/metrics").body, name, label);
  }
};

}  // namespace dsv41::test
