// DSML / reasoning output parser: one incremental state machine over decoded text
// (REASONING, CONTENT, BLOCK = inside a calls block, INVOKE = between parameters, PARAM_* = inside
// a parameter value, INVOKE_JSON = a JSON object as the whole invoke body).
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "dsv41/text/output_parser.h"
#include "text/utf8.h"

namespace dsv41::text {

namespace {

enum class Mode { Reasoning, Content, Block, Invoke, ParamString, ParamJson, ParamSkip, InvokeJson };

constexpr size_t kMaxTagBytes = 4096;  // a tag longer than this is not a tag

// Spellings of each tag: the DSML marker may come as the full-width token or ASCII bars, the
// space before the tag name may be missing (older format).
std::vector<std::string> spellings(const char* open, const char* name) {
  std::vector<std::string> out;
  for (const char* d : {"｜DSML｜", "|DSML|"})
    for (const char* sp : {" ", ""}) out.push_back(std::string(open) + d + sp + name);
  return out;
}

struct Tags {
  std::vector<std::string> calls_open = spellings("<", "calls>");
  std::vector<std::string> calls_close = spellings("</", "calls>");
  std::vector<std::string> invoke_open = spellings("<", "invoke");
  std::vector<std::string> invoke_close = spellings("</", "invoke>");
  std::vector<std::string> param_open = spellings("<", "parameter");
  std::vector<std::string> param_close = spellings("</", "parameter>");
  std::vector<std::string> value_end;  // anything that ends a parameter value
  std::vector<std::string> reasoning_markers, content_markers;
  Tags() {
    for (auto* v : {&param_close, &invoke_close, &calls_close}) value_end.insert(value_end.end(), v->begin(), v->end());
    reasoning_markers = {"</think>", "<think>"};
    for (const auto& s : calls_open) {
      reasoning_markers.push_back("\n\n" + s);
      reasoning_markers.push_back(s);
    }
    content_markers = reasoning_markers;
    for (const auto& s : invoke_open) {
      content_markers.push_back("\n\n" + s);
      content_markers.push_back(s);
    }
  }
};

const Tags& tags() {
  static const Tags t;
  return t;
}

enum class Prefix { No, Partial, Full };

// Does buf start with one of the spellings (Full, *len = its length), or could it (Partial)?
Prefix match_start(std::string_view buf, const std::vector<std::string>& options, size_t* len) {
  Prefix best = Prefix::No;
  for (const auto& s : options) {
    if (buf.size() >= s.size() && buf.compare(0, s.size(), s) == 0) {
      if (best != Prefix::Full || s.size() > *len) *len = s.size();
      best = Prefix::Full;
    } else if (best == Prefix::No && buf.size() < s.size() && s.compare(0, buf.size(), buf) == 0) {
      best = Prefix::Partial;
    }
  }
  return best;
}

// Earliest occurrence of any marker (longest on ties); npos when none.
size_t find_first(std::string_view buf, const std::vector<std::string>& markers, size_t* which) {
  size_t best = std::string_view::npos;
  for (size_t i = 0; i < markers.size(); ++i) {
    const size_t p = buf.find(markers[i]);
    if (p == std::string_view::npos) continue;
    if (p < best || (p == best && markers[i].size() > markers[*which].size())) {
      best = p;
      *which = i;
    }
  }
  return best;
}

// Length of the longest suffix of buf that is a proper prefix of some marker.
size_t hold_length(std::string_view buf, const std::vector<std::string>& markers) {
  size_t hold = 0;
  for (const auto& m : markers) {
    for (size_t k = std::min(buf.size(), m.size() - 1); k > hold; --k) {
      if (buf.compare(buf.size() - k, k, m, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

// Position of the '>' that ends a tag (outside attribute quotes), or npos.
size_t tag_end(std::string_view buf, size_t from) {
  bool quoted = false;
  for (size_t i = from; i < buf.size(); ++i) {
    if (buf[i] == '"') quoted = !quoted;
    else if (buf[i] == '>' && !quoted) return i;
  }
  return std::string_view::npos;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// key="value" pairs of a tag; false when the text is not a list of attributes.
bool parse_attributes(std::string_view s, std::vector<std::pair<std::string, std::string>>& out) {
  size_t i = 0;
  while (true) {
    while (i < s.size() && is_space(s[i])) ++i;
    if (i >= s.size()) return true;
    const size_t k0 = i;
    while (i < s.size() && s[i] != '=' && !is_space(s[i])) ++i;
    if (i == k0) return false;
    std::string key(s.substr(k0, i - k0));
    while (i < s.size() && is_space(s[i])) ++i;
    if (i >= s.size() || s[i] != '=') return false;
    ++i;
    while (i < s.size() && is_space(s[i])) ++i;
    std::string value;
    if (i < s.size() && s[i] == '"') {
      const size_t close = s.find('"', i + 1);
      if (close == std::string_view::npos) return false;
      value = std::string(s.substr(i + 1, close - i - 1));
      i = close + 1;
    } else {
      const size_t v0 = i;
      while (i < s.size() && !is_space(s[i])) ++i;
      value = std::string(s.substr(v0, i - v0));
    }
    out.emplace_back(std::move(key), std::move(value));
  }
}

std::string json_quote(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_escape_fragment(std::string_view s) {
  std::string q = json_quote(s);
  return q.substr(1, q.size() - 2);
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string random_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

}  // namespace

struct OutputParser::State {
  OutputParserOptions opt;
  Mode mode = Mode::Content;
  std::string buf;        // decoded text not yet resolved
  std::string utf8_tail;  // bytes of a character cut by the caller
  bool eof = false;
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  // block / call being parsed
  bool block_wrapped = false;
  bool block_has_call = false;
  std::string block_raw;  // markup consumed since the block began, while it has no call yet
  bool call_open = false;
  ToolCall call;
  int call_index = -1;
  size_t nparams = 0;
  std::set<std::string> param_names;
  std::vector<OutputEvent>* events = nullptr;

  void text_event(OutputEvent::Kind kind, std::string_view t) {
    if (t.empty()) return;
    (kind == OutputEvent::Kind::Reasoning ? reasoning : content).append(t);
    if (!events->empty() && events->back().kind == kind) {
      events->back().text.append(t);
      return;
    }
    OutputEvent e;
    e.kind = kind;
    e.text = std::string(t);
    events->push_back(std::move(e));
  }

  void start_call(std::string name) {
    call = ToolCall{opt.make_call_id ? opt.make_call_id() : random_call_id(), std::move(name), ""};
    call_open = true;
    nparams = 0;
    param_names.clear();
    if (!opt.parse_tool_calls) return;
    call_index = static_cast<int>(calls.size());
    OutputEvent e;
    e.kind = OutputEvent::Kind::ToolCallStart;
    e.index = call_index;
    e.id = call.id;
    e.name = call.name;
    events->push_back(std::move(e));
  }

  void args(std::string_view fragment) {
    if (fragment.empty()) return;
    call.arguments.append(fragment);
    if (!opt.parse_tool_calls) return;
    if (!events->empty() && events->back().kind == OutputEvent::Kind::ToolCallArguments &&
        events->back().index == call_index) {
      events->back().text.append(fragment);
      return;
    }
    OutputEvent e;
    e.kind = OutputEvent::Kind::ToolCallArguments;
    e.index = call_index;
    e.text = std::string(fragment);
    events->push_back(std::move(e));
  }

  // Closes the arguments object (unless the body was a complete JSON object) and the call.
  void end_call(bool close_object = true) {
    if (close_object) args(nparams == 0 ? "{}" : "}");
    call_open = false;
    if (!opt.parse_tool_calls) return;
    calls.push_back(call);
    OutputEvent e;
    e.kind = OutputEvent::Kind::ToolCallEnd;
    e.index = call_index;
    events->push_back(std::move(e));
  }

  void consume(size_t n) { buf.erase(0, n); }

  void enter_block(bool wrapped, std::string raw) {
    mode = Mode::Block;
    block_wrapped = wrapped;
    block_has_call = false;
    block_raw = std::move(raw);
  }

  // Markup that does not parse: what was held back becomes content again.
  void malformed_block() {
    if (call_open) end_call();
    if (!block_has_call) text_event(OutputEvent::Kind::Content, block_raw);
    block_raw.clear();
    mode = Mode::Content;
    // A bad invoke tag goes out as text here, or content parsing would enter the block again.
    size_t len = 0;
    if (match_start(buf, tags().invoke_open, &len) == Prefix::Full) {
      text_event(OutputEvent::Kind::Content, std::string_view(buf).substr(0, len));
      consume(len);
    }
  }

  bool step_text() {
    if (buf.empty()) return false;
    const bool in_reasoning = mode == Mode::Reasoning;
    const auto kind = in_reasoning ? OutputEvent::Kind::Reasoning : OutputEvent::Kind::Content;
    const auto& markers = in_reasoning ? tags().reasoning_markers : tags().content_markers;
    size_t which = 0;
    const size_t p = find_first(buf, markers, &which);
    if (p == std::string::npos) {
      const size_t keep = eof ? 0 : hold_length(buf, markers);
      text_event(kind, std::string_view(buf).substr(0, buf.size() - keep));
      consume(buf.size() - keep);
      return false;
    }
    text_event(kind, std::string_view(buf).substr(0, p));
    const std::string m = markers[which];
    if (m == "</think>") {
      consume(p + m.size());
      mode = Mode::Content;  // in content, a stray </think> is dropped
    } else if (m == "<think>") {
      consume(p + m.size());
      mode = Mode::Reasoning;  // in reasoning, a duplicate <think> is dropped
    } else if (m.find("calls>") != std::string::npos) {
      consume(p + m.size());
      enter_block(true, m);  // the tool block also ends reasoning
    } else {  // a bare invoke: keep the tag itself for the block parser
      const size_t lead = m[0] == '\n' ? 2 : 0;
      consume(p + lead);
      enter_block(false, m.substr(0, lead));
    }
    return true;
  }

  // Skips whitespace between tags; inside a block that has no call yet, it is kept for a
  // possible fallback to content.
  void skip_space() {
    size_t n = 0;
    while (n < buf.size() && is_space(buf[n])) ++n;
    if (mode == Mode::Block && !block_has_call) block_raw.append(buf, 0, n);
    consume(n);
  }

  // Parses `<D invoke name="...">` / `<D parameter ...>`. Returns 1 done, 0 need more, -1 bad.
  int read_open_tag(size_t prefix_len, std::vector<std::pair<std::string, std::string>>& attrs, size_t* total) {
    const size_t end = tag_end(buf, prefix_len);
    if (end == std::string::npos) return buf.size() > kMaxTagBytes ? -1 : 0;  // at the end: swallowed
    if (!parse_attributes(std::string_view(buf).substr(prefix_len, end - prefix_len), attrs)) return -1;
    *total = end + 1;
    return 1;
  }

  static const std::string* attr(const std::vector<std::pair<std::string, std::string>>& a, const char* k) {
    for (const auto& [key, v] : a)
      if (key == k) return &v;
    return nullptr;
  }

  bool step_block() {
    skip_space();
    if (buf.empty()) return false;
    size_t len = 0;
    const Prefix inv = match_start(buf, tags().invoke_open, &len);
    if (inv == Prefix::Full) {
      std::vector<std::pair<std::string, std::string>> a;
      size_t total = 0;
      const int r = read_open_tag(len, a, &total);
      if (r == 0) return false;
      const std::string* name = r > 0 ? attr(a, "name") : nullptr;
      if (!name || name->empty()) {
        malformed_block();
        return true;
      }
      const std::string n = *name;
      consume(total);
      block_has_call = true;
      block_raw.clear();
      start_call(n);
      mode = Mode::Invoke;
      return true;
    }
    const Prefix close = match_start(buf, tags().calls_close, &len);
    if (close == Prefix::Full && block_wrapped) {
      consume(len);
      mode = Mode::Content;
      return true;
    }
    // A cut tag waits for more text; at the end of output it is swallowed (finish drops it).
    if (inv == Prefix::Partial || close == Prefix::Partial) return false;
    if (!block_wrapped && block_has_call) {  // bare invokes end where something else begins
      mode = Mode::Content;
      return true;
    }
    malformed_block();
    return true;
  }

  bool step_invoke() {
    skip_space();
    if (buf.empty()) return false;
    size_t len = 0;
    const Prefix po = match_start(buf, tags().param_open, &len);
    if (po == Prefix::Full) {
      std::vector<std::pair<std::string, std::string>> a;
      size_t total = 0;
      const int r = read_open_tag(len, a, &total);
      if (r == 0) return false;
      const std::string* name = r > 0 ? attr(a, "name") : nullptr;
      if (!name) {
        malformed_block();
        return true;
      }
      const std::string key = *name;
      const std::string* str = attr(a, "string");
      consume(total);
      if (!param_names.insert(key).second) {  // a repeated name: keep the first value
        mode = Mode::ParamSkip;
        return true;
      }
      args(std::string(nparams == 0 ? "{" : ", ") + json_quote(key) + ": ");
      ++nparams;
      if (str && *str == "true") {
        args("\"");
        mode = Mode::ParamString;
      } else {
        mode = Mode::ParamJson;  // string="false" (or missing): JSON, kept as a string if invalid
      }
      return true;
    }
    const Prefix ic = match_start(buf, tags().invoke_close, &len);
    if (ic == Prefix::Full) {
      consume(len);
      end_call();
      mode = Mode::Block;
      return true;
    }
    const Prefix cc = match_start(buf, tags().calls_close, &len);
    if (cc == Prefix::Full) {  // calls block closed without closing the invoke
      consume(len);
      end_call();
      mode = Mode::Content;
      return true;
    }
    if (po == Prefix::Partial || ic == Prefix::Partial || cc == Prefix::Partial) return false;
    if (buf[0] == '{' && nparams == 0) {
      mode = Mode::InvokeJson;
      return true;
    }
    malformed_block();
    return true;
  }

  bool step_value() {
    size_t which = 0;
    const auto& ends = tags().value_end;
    size_t p = find_first(buf, ends, &which);
    const bool found = p != std::string::npos;
    if (!found && !eof) {
      if (mode == Mode::ParamString) {  // stream the value, holding back a possible closing tag
        const size_t keep = hold_length(buf, ends);
        args(json_escape_fragment(std::string_view(buf).substr(0, buf.size() - keep)));
        consume(buf.size() - keep);
      }
      return false;
    }
    if (!found) p = buf.size();
    const std::string_view value = std::string_view(buf).substr(0, p);
    if (mode == Mode::ParamString) {
      args(json_escape_fragment(value) + "\"");
    } else if (mode == Mode::ParamJson) {
      const std::string t = trim(value);
      args(!t.empty() && nlohmann::json::accept(t) ? t : json_quote(value));
    }
    const bool is_param_close = found && which < tags().param_close.size();
    consume(p + (is_param_close ? ends[which].size() : 0));
    mode = Mode::Invoke;
    return true;
  }

  bool step_invoke_json() {
    size_t which = 0;
    size_t p = find_first(buf, tags().invoke_close, &which);
    if (p == std::string::npos) {
      if (!eof) return false;
      p = buf.size();
    }
    const std::string body = trim(std::string_view(buf).substr(0, p));
    const auto parsed = nlohmann::json::parse(body, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) {
      args(body);  // the object is the whole arguments text
      end_call(/*close_object=*/false);
    } else {
      end_call();
      text_event(OutputEvent::Kind::Content, body);
    }
    consume(std::min(buf.size(), p + (p < buf.size() ? tags().invoke_close[which].size() : 0)));
    mode = Mode::Block;
    return true;
  }

  void run() {
    for (;;) {
      bool progressed = false;
      switch (mode) {
        case Mode::Reasoning:
        case Mode::Content: progressed = step_text(); break;
        case Mode::Block: progressed = step_block(); break;
        case Mode::Invoke: progressed = step_invoke(); break;
        case Mode::ParamString:
        case Mode::ParamJson:
        case Mode::ParamSkip: progressed = step_value(); break;
        case Mode::InvokeJson: progressed = step_invoke_json(); break;
      }
      if (!progressed) return;
    }
  }
};

OutputParser::OutputParser(OutputParserOptions options) : s_(std::make_unique<State>()) {
  s_->opt = std::move(options);
  s_->mode = s_->opt.starts_in_reasoning ? Mode::Reasoning : Mode::Content;
}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

void OutputParser::feed(std::string_view text, std::vector<OutputEvent>& events) {
  if (s_->eof) return;
  s_->events = &events;
  std::string joined = s_->utf8_tail;
  joined.append(text);
  const size_t n = utf8::complete_prefix(joined);
  s_->utf8_tail = joined.substr(n);
  s_->buf += utf8::decode_lossy(std::string_view(joined).substr(0, n));
  s_->run();
  s_->events = nullptr;
}

void OutputParser::finish(std::vector<OutputEvent>& events) {
  if (s_->eof) return;
  s_->events = &events;
  s_->buf += utf8::decode_lossy(s_->utf8_tail);
  s_->utf8_tail.clear();
  s_->eof = true;
  s_->run();
  // Whatever is left is an unterminated block: close an open call, drop bare markup.
  if (s_->call_open) s_->end_call();
  s_->buf.clear();
  s_->events = nullptr;
}

const std::string& OutputParser::reasoning() const { return s_->reasoning; }
const std::string& OutputParser::content() const { return s_->content; }
const std::vector<ToolCall>& OutputParser::tool_calls() const { return s_->calls; }
bool OutputParser::in_reasoning() const { return s_->mode == Mode::Reasoning; }

}  // namespace dsv41::text
