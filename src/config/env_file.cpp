#include "dsv41/config/env_file.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "dsv41/common/error.h"

namespace dsv41::config {
namespace {

bool is_key_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_key_char(char c) { return is_key_start(c) || (c >= '0' && c <= '9'); }
bool is_blank(char c) { return c == ' ' || c == '\t'; }

// Characters that make bash do something other than take them literally in an unquoted word.
bool is_shell_special(char c) {
  switch (c) {
    case '$': case '`': case '\\': case ';': case '&': case '|': case '<': case '>': case '(': case ')':
    case '*': case '?': case '[': case ']': case '{': case '}': case '!':
      return true;
  }
  return false;
}

// Parses the value part of one line; `s` starts right after '='.
std::string parse_value(std::string_view s, const std::string& where) {
  std::string out;
  size_t i = 0;
  while (i < s.size() && !is_blank(s[i])) {
    char c = s[i];
    if (c == '\'') {
      size_t end = s.find('\'', i + 1);
      if (end == std::string_view::npos) fail("{}: unterminated single quote", where);
      out.append(s.substr(i + 1, end - i - 1));
      i = end + 1;
    } else if (c == '"') {
      ++i;
      bool closed = false;
      while (i < s.size()) {
        char d = s[i];
        if (d == '"') {
          closed = true;
          ++i;
          break;
        }
        if (d == '\\' && i + 1 < s.size() &&
            (s[i + 1] == '"' || s[i + 1] == '\\' || s[i + 1] == '$' || s[i + 1] == '`')) {
          out += s[i + 1];
          i += 2;
          continue;
        }
        if (d == '$' || d == '`')
          fail("{}: '{}' inside double quotes would be expanded by bash; write \\{} or use single quotes", where, d, d);
        out += d;
        ++i;
      }
      if (!closed) fail("{}: unterminated double quote", where);
    } else if (c == '$' || c == '`') {
      fail("{}: variable or command expansion ('{}') is not supported; write the value literally", where, c);
    } else if (is_shell_special(c)) {
      fail("{}: character '{}' must be quoted (bash treats it specially)", where, c);
    } else {
      // Tilde expansion happens in bash only at the start of an unquoted value.
      if (c == '~' && i == 0 && (s.size() == 1 || s[1] == '/' || is_blank(s[1]))) {
        const char* home = std::getenv("HOME");
        if (!home || !*home) fail("{}: '~' needs $HOME, which is not set", where);
        out += home;
      } else {
        out += c;
      }
      ++i;
    }
  }
  size_t j = i;
  while (j < s.size() && is_blank(s[j])) ++j;
  if (j < s.size()) {
    if (j > i && s[j] == '#') return out;  // trailing comment
    fail("{}: unexpected text after the value: '{}' (quote values that contain spaces)", where, s.substr(j));
  }
  return out;
}

bool is_env_passthrough(std::string_view key) {
  for (std::string_view p : {"NCCL_", "GLOO_", "CUDA_", "UCX_", "OMP_"})
    if (key.substr(0, p.size()) == p) return true;
  return false;
}

// DSV41_FOO_BAR -> --foo-bar
std::string option_for_key(std::string_view key) {
  std::string o = "--";
  for (char c : key.substr(6)) o += c == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

}  // namespace

const EnvEntry* EnvFile::find(std::string_view key) const {
  for (auto it = entries.rbegin(); it != entries.rend(); ++it)
    if (it->key == key) return &*it;
  return nullptr;
}

std::string EnvFile::get(std::string_view key, std::string fallback) const {
  const EnvEntry* e = find(key);
  return e ? e->value : fallback;
}

EnvFile parse_env_text(std::string_view text, const std::string& origin) {
  EnvFile f;
  f.path = origin;
  std::map<std::string, int> first_line;
  int lineno = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++lineno;
    std::string where = fmt::format("{}:{}", origin, lineno);
    if (!line.empty() && line.back() == '\r')
      fail("{}: line ends with a carriage return (Windows line endings); bash would keep it in the value", where);
    if (line.find('\0') != std::string_view::npos) fail("{}: NUL byte in the line", where);
    size_t i = 0;
    while (i < line.size() && is_blank(line[i])) ++i;
    if (i == line.size() || line[i] == '#') continue;
    if (line.substr(i, 7) == "export " || line.substr(i, 7) == "export\t") {
      i += 7;
      while (i < line.size() && is_blank(line[i])) ++i;
    }
    size_t k = i;
    if (k >= line.size() || !is_key_start(line[k]))
      fail("{}: expected KEY=VALUE, got '{}'", where, line);
    while (k < line.size() && is_key_char(line[k])) ++k;
    std::string key(line.substr(i, k - i));
    if (k >= line.size() || line[k] != '=') {
      size_t j = k;
      while (j < line.size() && is_blank(line[j])) ++j;
      if (j < line.size() && line[j] == '=')
        fail("{}: no spaces allowed around '=' in '{}' (bash would run it as a command)", where, line);
      fail("{}: expected KEY=VALUE, got '{}'", where, line);
    }
    std::string value = parse_value(line.substr(k + 1), where);
    auto [it, fresh] = first_line.emplace(key, lineno);
    if (!fresh)
      f.warnings.push_back(fmt::format("{}: {} is also set on line {}; the last one wins", where, key, it->second));
    f.entries.push_back({key, value, lineno});
  }
  return f;
}

EnvFile parse_env_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read configuration file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_env_text(ss.str(), path);
}

const std::vector<KnownEnvKey>& known_env_keys() {
  static const std::vector<KnownEnvKey> keys = {
      {"DSV41_MODEL", "--model", "checkpoint folder"},
      {"DSV41_HOST", "--host", "HTTP bind address (rank 0)"},
      {"DSV41_PORT", "--port", "HTTP port (rank 0)"},
      {"DSV41_MASTER_ADDR", "--master-addr", "rank 0's control address"},
      {"DSV41_MASTER_PORT", "--master-port", "rank 0's control port"},
      {"DSV41_WORLD_SIZE", "--world-size", "number of ranks"},
      {"DSV41_API_KEY", "--api-key", "bearer token clients must send"},
      {"DSV41_ENGRAM_DIR", "--engram-dir", "original checkpoint's Engram shards"},
      {"DSV41_ENGRAM_TOKEN_MAP", "--engram-token-map", "Engram token map file"},
      {"DSV41_ENGRAM_PACKED", "--engram-packed", "packed Engram table file (pack-engram output)"},
      {"DSV41_ENGRAM_CACHE_GIB", "--engram-cache-gib", "Engram row cache size"},
      {"DSV41_SPEC_METHOD", "--spec-method", "speculative decoding: dspark or none"},
      {"DSV41_SPEC_TOKENS", "--spec-tokens", "most draft tokens per step"},
      {"DSV41_DEVICE", "--device", "cpu, cuda or auto"},
      {"DSV41_LOG_LEVEL", "--log-level", "trace, debug, info, warn, error"},
      {"DSV41_KV_CACHE_GIB", "--kv-cache-gib", "sequence-state pool size"},
      {"DSV41_MEMORY_MARGIN_GIB", "--memory-margin-gib", "memory kept free (start-up budget, watchdog)"},
      {"DSV41_LOG_DIR", "--log-dir", "logs, pid files, stall dumps"},
      {"DSV41_STALL_TIMEOUT_S", "--stall-timeout-s", "seconds without step progress before a stall dump"},
      // Launcher-only keys (scripts/dsv41.sh).
      {"DSV41_WORKER_HOST", "", "ssh destination of rank 1"},
      {"DSV41_WORKER_ADDR", "", "rank 1's address on the fabric (default: DSV41_WORKER_HOST)"},
      {"DSV41_REMOTE", "", "ssh or local (run rank 1 as a local process)"},
      {"DSV41_SSH_OPTS", "", "extra ssh options"},
      {"DSV41_BIN", "", "dsv41-serve binary on the head"},
      {"DSV41_WORKER_BIN", "", "dsv41-serve binary on the worker"},
      {"DSV41_WORKER_MODEL", "", "checkpoint folder on the worker"},
      {"DSV41_WORKER_ENGRAM_DIR", "", "Engram folder on the worker"},
      {"DSV41_WORKER_LOG_DIR", "", "log folder on the worker"},
      {"DSV41_EXTRA_ARGS", "", "extra flags for rank 0"},
      {"DSV41_WORKER_EXTRA_ARGS", "", "extra flags for rank 1"},
      {"DSV41_START_TIMEOUT_S", "", "seconds to wait for /health"},
      {"DSV41_STOP_TIMEOUT_S", "", "seconds before SIGKILL on stop"},
  };
  return keys;
}

EnvApplyResult apply_env_file(CLI::App& app, const EnvFile& file) {
  EnvApplyResult r;
  r.warnings = file.warnings;
  std::map<std::string, const KnownEnvKey*> known;
  for (const auto& k : known_env_keys()) known[k.key] = &k;

  std::map<std::string, const EnvEntry*> last;  // the entry that wins for each key
  for (const auto& e : file.entries) last[e.key] = &e;

  for (const auto& entry : file.entries) {  // file order, so warnings come in line order
    if (last[entry.key] != &entry) continue;
    const std::string& key = entry.key;
    const EnvEntry* e = &entry;
    std::string where = fmt::format("{}:{}", file.path, e->line);
    if (is_env_passthrough(key)) {
      if (std::getenv(key.c_str()) == nullptr) {
        ::setenv(key.c_str(), e->value.c_str(), 0);
        r.exported.push_back(fmt::format("{}={}", key, e->value));
      }
      continue;
    }
    auto kn = known.find(key);
    std::string opt_name;
    if (kn != known.end()) {
      if (*kn->second->option == '\0') continue;  // launcher-only
      opt_name = kn->second->option;
    } else if (key.rfind("DSV41_", 0) == 0 && key.size() > 6) {
      opt_name = option_for_key(key);
    } else {
      r.warnings.push_back(fmt::format("{}: unknown key {} (ignored)", where, key));
      continue;
    }
    CLI::Option* opt = app.get_option_no_throw(opt_name);
    if (opt == nullptr) {
      if (kn == known.end()) r.warnings.push_back(fmt::format("{}: unknown key {} (ignored)", where, key));
      continue;  // a known key this command has no use for
    }
    if (opt->count() > 0) {
      r.kept_command_line.push_back(key);
      continue;
    }
    if (e->value.empty()) continue;  // KEY= means "not set"
    try {
      opt->add_result(e->value);
      opt->run_callback();
    } catch (const CLI::Error& err) {
      opt->clear();
      fail("{}: {}={}: invalid value for {}: {}", where, key, e->value, opt_name, err.what());
    }
    bool secret = false;
    for (std::string_view suffix : {"_KEY", "_TOKEN", "_SECRET", "_PASSWORD"})
      secret = secret || (key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0);
    r.applied.push_back(fmt::format("{} -> {}={}", key, opt_name, secret ? "***" : e->value));
  }
  return r;
}

EnvApplyResult apply_env_file(CLI::App& app, const std::string& path) {
  return apply_env_file(app, parse_env_file(path));
}

void log_env_apply_result(const std::string& path, const EnvApplyResult& r) {
  for (const auto& w : r.warnings) spdlog::warn("config: {}", w);
  for (const auto& a : r.applied) spdlog::debug("config {}: {}", path, a);
  for (const auto& k : r.kept_command_line) spdlog::debug("config {}: {} overridden by the command line", path, k);
  for (const auto& x : r.exported) spdlog::debug("config {}: exported {}", path, x);
  spdlog::info("config {}: {} settings applied, {} overridden by flags", path, r.applied.size(),
               r.kept_command_line.size());
}

}  // namespace dsv41::config
