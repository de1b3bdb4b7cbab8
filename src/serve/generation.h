// One accepted generation request (chat or legacy completion) with its n choices: submits them to
// the scheduler, follows their channels, and renders the non-streamed body or the SSE stream.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsv41/serve/http.h"
#include "sched/scheduler.h"
#include "serve/api.h"
#include "serve/request_params.h"

namespace dsv41::serve {

struct ChoiceInput {
  std::vector<int32_t> prompt;
  bool thinking = false;
  std::string echo_text;  // completions with echo: the prompt text, emitted first
};

struct GenerationSpec {
  bool chat = true;
  std::string model;
  GenerationParams params;
  std::vector<ChoiceInput> prompts;  // chat: one; completions: one per prompt (each gets n choices)
  bool parse_tools = false;
  bool parallel_tool_calls = true;
  int64_t max_tokens = 16;  // resolved limit for every choice
};

// Submits every choice; throws ApiError (400 / 429 / 503) when the scheduler refuses one (the
// others are cancelled). Returns the HTTP response (a body, or a stream producer).
// client_gone (may be empty) lets a waiting handler notice a client that hung up: its sequences
// are cancelled.
HttpResponse run_generation(GenerationSpec spec, sched::Scheduler& sched, const TextBackend& text,
                            const ApiOptions& opt, std::shared_ptr<Metrics> metrics,
                            std::function<bool()> client_gone = {});

}  // namespace dsv41::serve
