// The bare form's --config FILE reaches the server options: a model folder named only in the
// file must be the one the binary tries to open, and a flag on the command line must win.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "../support/run_cli.h"

namespace {

std::string write_env(const std::string& body) {
  const std::string path = "/tmp/dsv41_config_flag_" + std::to_string(getpid()) + ".env";
  std::ofstream(path) << body;
  return path;
}

}  // namespace

TEST(ConfigFlag, FileSetsTheModelFolder) {
  const std::string env = write_env("DSV41_MODEL=/nonexistent/model-from-config-file\n");
  const auto r = dsv41::test::run_cli("--config " + env, dsv41::test::Stderr::kMerge);
  std::remove(env.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("model-from-config-file"), std::string::npos) << r.out;
}

TEST(ConfigFlag, CommandLineWinsOverTheFile) {
  const std::string env = write_env("DSV41_MODEL=/nonexistent/model-from-config-file\n");
  const auto r = dsv41::test::run_cli("--config " + env + " --model /nonexistent/model-from-flag",
                                      dsv41::test::Stderr::kMerge);
  std::remove(env.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("model-from-flag"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("model-from-config-file"), std::string::npos) << r.out;
}

TEST(ConfigFlag, MalformedFileIsOneError) {
  const std::string env = write_env("this is not a KEY=VALUE line\n");
  const auto r = dsv41::test::run_cli("--config " + env, dsv41::test::Stderr::kMerge);
  std::remove(env.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find(":1:"), std::string::npos) << r.out;
}
