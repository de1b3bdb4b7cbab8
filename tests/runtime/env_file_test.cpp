#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dsv41/common/error.h"
#include "cli/serve_options.h"
#include "dsv41/config/env_file.h"
#include "dsv41/runtime/ops_options.h"

using namespace dsv41::config;
namespace fs = std::filesystem;

namespace {

std::string error_of(std::string_view text) {
  try {
    parse_env_text(text, "cfg.env");
  } catch (const dsv41::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A root app with the options of the bare form that the file feeds.
struct App {
  CLI::App app{"test"};
  std::string model, host = "127.0.0.1", api_key;
  int port = 8888, master_port = 29500;
  double margin = 4.0;
  App() {
    app.add_option("--model", model);
    app.add_option("--host", host);
    app.add_option("--port", port)->check(CLI::Range(1, 65535));
    app.add_option("--master-port", master_port);
    app.add_option("--api-key", api_key);
    app.add_option("--memory-margin-gib", margin);
  }
  void parse(std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());
    app.parse(args);
  }
};

EnvFile parse_example_config() {
  return parse_env_file(std::string(DSV41_SOURCE_DIR) + "/configs/dsv41.env.example");
}

}  // namespace

TEST(EnvFile, BashCompatibleSyntax) {
  setenv("HOME", "/home/op", 1);
  auto f = parse_env_text(
      "# comment\n"
      "\n"
      "   # indented comment\n"
      "DSV41_MODEL=/models/dsv41\n"
      "export DSV41_PORT=8000\n"
      "DSV41_HOST='0.0.0.0'   # bind everywhere\n"
      "DSV41_API_KEY=\"sk-a b\\\"c\\$d\"\n"
      "DSV41_LOG_DIR=~/logs\n"
      "DSV41_EMPTY=\n"
      "DSV41_MIX=a'b c'\"d\"\n"
      "DSV41_HASH=a#b\n",
      "cfg.env");
  EXPECT_EQ(f.get("DSV41_MODEL"), "/models/dsv41");
  EXPECT_EQ(f.get("DSV41_PORT"), "8000");
  EXPECT_EQ(f.get("DSV41_HOST"), "0.0.0.0");
  EXPECT_EQ(f.get("DSV41_API_KEY"), "sk-a b\"c$d");
  EXPECT_EQ(f.get("DSV41_LOG_DIR"), "/home/op/logs");
  EXPECT_EQ(f.get("DSV41_EMPTY", "unset"), "");
  EXPECT_EQ(f.get("DSV41_MIX"), "ab cd");
  EXPECT_EQ(f.get("DSV41_HASH"), "a#b");
  EXPECT_EQ(f.find("DSV41_MODEL")->line, 4);
  EXPECT_EQ(f.find("NOPE"), nullptr);
}

TEST(EnvFile, MalformedLinesGiveFileAndLine) {
  EXPECT_EQ(error_of("A=1\nB = 2\n").rfind("cfg.env:2: no spaces allowed around '='", 0), 0u) << error_of("A=1\nB = 2\n");
  EXPECT_EQ(error_of("A=1\n\njust words\n").rfind("cfg.env:3: expected KEY=VALUE", 0), 0u);
  EXPECT_EQ(error_of("A=two words\n").rfind("cfg.env:1: unexpected text after the value", 0), 0u);
  EXPECT_EQ(error_of("A=$HOME/x\n").rfind("cfg.env:1: variable or command expansion", 0), 0u);
  EXPECT_EQ(error_of("A=\"$HOME\"\n").rfind("cfg.env:1: '$' inside double quotes", 0), 0u);
  EXPECT_EQ(error_of("A='open\n").rfind("cfg.env:1: unterminated single quote", 0), 0u);
  EXPECT_EQ(error_of("A=\"open\n").rfind("cfg.env:1: unterminated double quote", 0), 0u);
  EXPECT_EQ(error_of("A=1\r\n").rfind("cfg.env:1: line ends with a carriage return", 0), 0u);
  EXPECT_EQ(error_of("A=x;rm\n").rfind("cfg.env:1: character ';' must be quoted", 0), 0u);
  EXPECT_EQ(error_of("1A=x\n").rfind("cfg.env:1: expected KEY=VALUE", 0), 0u);
}

TEST(EnvFile, DuplicateKeysWarnAndLastWins) {
  auto f = parse_env_text("DSV41_PORT=1\nDSV41_PORT=2\n", "cfg.env");
  EXPECT_EQ(f.get("DSV41_PORT"), "2");
  ASSERT_EQ(f.warnings.size(), 1u);
  EXPECT_NE(f.warnings[0].find("cfg.env:2"), std::string::npos);
}

TEST(EnvFile, FlagsOverrideTheFileAndUnknownKeysWarn) {
  unsetenv("NCCL_DEBUG_TEST_DSV41");
  App a;
  a.parse({"--port", "9001"});
  auto f = parse_env_text(
      "DSV41_MODEL=/m\nDSV41_PORT=8000\nDSV41_MEMORY_MARGIN_GIB=6.5\nDSV41_WORKER_HOST=spark-2\n"
      "DSV41_API_KEY=secret\nDSV41_NOT_A_THING=1\nFOO=bar\nNCCL_DEBUG_TEST_DSV41=INFO\nDSV41_KV_CACHE_GIB=20\n",
      "cfg.env");
  auto r = apply_env_file(a.app, f);
  EXPECT_EQ(a.model, "/m");
  EXPECT_EQ(a.port, 9001) << "the command line wins";
  EXPECT_DOUBLE_EQ(a.margin, 6.5);
  EXPECT_EQ(a.api_key, "secret");
  EXPECT_EQ(a.host, "127.0.0.1");
  ASSERT_EQ(r.kept_command_line.size(), 1u);
  EXPECT_EQ(r.kept_command_line[0], "DSV41_PORT");
  // Unknown: DSV41_NOT_A_THING (no such option) and FOO; launcher-only and known-but-unused keys are quiet.
  ASSERT_EQ(r.warnings.size(), 2u) << ::testing::PrintToString(r.warnings);
  EXPECT_NE(r.warnings[0].find("cfg.env:6: unknown key DSV41_NOT_A_THING"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("cfg.env:7: unknown key FOO"), std::string::npos) << r.warnings[1];
  ASSERT_NE(std::getenv("NCCL_DEBUG_TEST_DSV41"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_DEBUG_TEST_DSV41"), "INFO");
  for (const auto& s : r.applied) EXPECT_EQ(s.find("secret"), std::string::npos) << "API key leaked: " << s;
  unsetenv("NCCL_DEBUG_TEST_DSV41");
}

TEST(EnvFile, InvalidValueNamesFileLineAndOption) {
  App a;
  a.parse({});
  auto f = parse_env_text("# x\nDSV41_PORT=70000\n", "cfg.env");
  try {
    apply_env_file(a.app, f);
    FAIL() << "out-of-range port accepted";
  } catch (const dsv41::Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("cfg.env:2: DSV41_PORT=70000: invalid value for --port", 0), 0u) << m;
  }
  App b;
  b.parse({});
  EXPECT_THROW(apply_env_file(b.app, parse_env_text("DSV41_PORT=eighty\n", "c")), dsv41::Error);
}

TEST(EnvFile, ExampleConfigParsesAndEveryKeyIsKnown) {
  std::string path = std::string(DSV41_SOURCE_DIR) + "/configs/dsv41.env.example";
  EnvFile f = parse_env_file(path);
  EXPECT_TRUE(f.warnings.empty());
  ASSERT_GT(f.entries.size(), 10u);
  for (const auto& e : f.entries) {
    bool known = e.key.rfind("NCCL_", 0) == 0 || e.key.rfind("GLOO_", 0) == 0;
    for (const auto& k : known_env_keys()) known = known || e.key == k.key;
    EXPECT_TRUE(known) << path << ":" << e.line << ": " << e.key << " is not in known_env_keys()";
  }
  for (const char* k : {"DSV41_MODEL", "DSV41_PORT", "DSV41_HOST", "DSV41_WORKER_HOST", "DSV41_MASTER_ADDR",
                        "DSV41_MASTER_PORT", "DSV41_API_KEY", "DSV41_ENGRAM_DIR", "DSV41_KV_CACHE_GIB",
                        "DSV41_MEMORY_MARGIN_GIB", "DSV41_LOG_DIR"})
    EXPECT_NE(f.find(k), nullptr) << k << " missing from the example";
  EXPECT_EQ(f.get("DSV41_MEMORY_MARGIN_GIB"), "4");
}

TEST(EnvFile, ExampleConfigIsAcceptedByBash) {
  // The same file must be `source`-able: bash prints the values it sees, compared with ours.
  std::string path = std::string(DSV41_SOURCE_DIR) + "/configs/dsv41.env.example";
  EnvFile f = parse_env_file(path);
  fs::path out = fs::temp_directory_path() / fmt::format("dsv41_envcheck_{}", ::getpid());
  std::string cmd = "bash -c 'set -eu; source \"$0\"; ";
  for (const auto& e : f.entries) cmd += fmt::format("printf \"%s=%s\\n\" {} \"${}\"; ", e.key, e.key);
  cmd += "' " + path + " > " + out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  std::string line;
  size_t i = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(i, f.entries.size());
    EXPECT_EQ(line, f.entries[i].key + "=" + f.get(f.entries[i].key));
    ++i;
  }
  EXPECT_EQ(i, f.entries.size());
  fs::remove(out);
}

TEST(EnvFile, FeedsTheBareFormOptions) {
  // The real option set of the bare form (server/worker), the operations flags included.
  CLI::App app("dsv41-serve");
  dsv41::cli::ServeOptions serve;
  dsv41::cli::add_serve_options(app, serve);
  const dsv41::runtime::OpsOptions& ops = serve.ops;
  app.parse(std::vector<std::string>{"1", "--rank"});
  auto f = parse_example_config();
  auto r = apply_env_file(app, f);
  EXPECT_EQ(serve.model_dir, "/models/DeepSeek-V4.1-Flash");
  EXPECT_EQ(serve.host, "0.0.0.0");
  EXPECT_EQ(serve.port, 8888);
  EXPECT_EQ(serve.master_addr, "192.168.100.1");
  EXPECT_EQ(serve.world_size, 2);
  EXPECT_EQ(serve.rank, 1);
  EXPECT_DOUBLE_EQ(ops.memory_margin_gib, 4.0);
  EXPECT_DOUBLE_EQ(ops.stall_timeout_s, 60.0);
  EXPECT_EQ(ops.log_dir, "logs");
  EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(r.warnings);
}
