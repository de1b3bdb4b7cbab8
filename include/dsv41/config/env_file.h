// The deployment configuration file (configs/dsv41.env.example): KEY=VALUE lines that bash can
// `source` (the launcher does) and that the binary reads with `--config FILE`; command-line flags
// override it. Accepted syntax is the subset on which bash and this parser agree:
//   # comment lines, blank lines, optional `export `, KEY=VALUE with no spaces around '=',
//   VALUE = unquoted word | 'single quoted' | "double quoted" (escapes \" \\ \$ \`), concatenated,
//   a leading ~ expands to $HOME, a trailing `# comment` after whitespace.
// Rejected with file:line: $-expansion, command substitution, unquoted spaces, CR line endings.
//
// Keys map onto options: DSV41_MODEL -> --model, DSV41_PORT -> --port, ...; in general DSV41_FOO_BAR
// -> --foo-bar when the command has that option. NCCL_* / GLOO_* / CUDA_* / UCX_* keys become
// environment variables (unless already set). Launcher-only keys (DSV41_WORKER_HOST, ...) are
// accepted silently; anything else gets a warning.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace dsv41::config {

struct EnvEntry {
  std::string key;
  std::string value;
  int line = 0;
};

struct EnvFile {
  std::string path;
  std::vector<EnvEntry> entries;  // in file order; a key set twice appears twice (last wins)
  std::vector<std::string> warnings;
  // The last entry for `key`, or nullptr.
  const EnvEntry* find(std::string_view key) const;
  std::string get(std::string_view key, std::string fallback = {}) const;
};

// Throws dsv41::Error "<origin>:<line>: <problem>" on the first malformed line.
EnvFile parse_env_text(std::string_view text, const std::string& origin);
EnvFile parse_env_file(const std::string& path);

struct KnownEnvKey {
  const char* key;
  const char* option;  // CLI option it sets; "" for launcher-only keys
  const char* help;
};
const std::vector<KnownEnvKey>& known_env_keys();

struct EnvApplyResult {
  std::vector<std::string> applied;            // "DSV41_PORT -> --port=8000"
  std::vector<std::string> kept_command_line;  // keys whose option was given on the command line
  std::vector<std::string> exported;           // NCCL_*/GLOO_*/... set into the environment
  std::vector<std::string> warnings;           // unknown keys, duplicates, unused keys
};

// Call AFTER app.parse(): fills every option of `app` (and of its nameless option groups) that was
// not given on the command line from the file, running the option's validators and conversions
// (a bad value is one dsv41::Error naming file:line). Nothing is logged here (logging may not be
// set up yet); pass the result to log_env_apply_result() once it is.
EnvApplyResult apply_env_file(CLI::App& app, const EnvFile& file);
EnvApplyResult apply_env_file(CLI::App& app, const std::string& path);

void log_env_apply_result(const std::string& path, const EnvApplyResult& r);

}  // namespace dsv41::config
