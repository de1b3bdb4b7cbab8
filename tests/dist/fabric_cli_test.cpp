// `dsv41-serve fabric` on this host: must work with or without RDMA devices (exit 0).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace {

struct Result {
  int rc;
  std::string out;
};

Result run(const std::string& args) {
  std::string cmd = std::string(DSV41_BINARY) + " " + args + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = ::pclose(p);
  return {WEXITSTATUS(st), out};
}

}  // namespace

TEST(FabricCli, JsonDescribesThisHost) {
  Result r = run("fabric --json --peer 127.0.0.1");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"devices", "interfaces", "peer", "transport", "selected", "env", "summary", "warnings"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["peer"], "127.0.0.1");
  ASSERT_TRUE(j["env"].contains("NCCL_IB_DISABLE"));
  if (j["devices"].empty()) {
    EXPECT_EQ(j["transport"], "socket");
    EXPECT_EQ(j["env"]["NCCL_IB_DISABLE"], "1");
    EXPECT_NE(j["summary"].get<std::string>().find("no RDMA devices found"), std::string::npos);
    EXPECT_TRUE(j["selected"].is_null());
  }
  // The socket interface, when named, is one of this host's interfaces and holds the peer's subnet.
  if (!j["socket_ifname"].is_null()) {
    bool listed = false;
    for (const auto& i : j["interfaces"]) listed = listed || i["name"] == j["socket_ifname"];
    EXPECT_TRUE(listed) << j.dump();
  }
}

TEST(FabricCli, EnvLinesAreKeyValueAndTextSaysWhatHappens) {
  Result e = run("fabric --env");
  ASSERT_EQ(e.rc, 0);
  ASSERT_FALSE(e.out.empty());
  size_t pos = 0;
  while (pos < e.out.size()) {
    size_t eol = e.out.find('\n', pos);
    std::string line = e.out.substr(pos, eol - pos);
    EXPECT_TRUE(line.rfind("NCCL_", 0) == 0 || line.rfind("GLOO_", 0) == 0) << line;
    EXPECT_NE(line.find('='), std::string::npos) << line;
    pos = eol + 1;
  }
  Result t = run("fabric");
  ASSERT_EQ(t.rc, 0);
  EXPECT_NE(t.out.find("choice: "), std::string::npos);
  EXPECT_NE(t.out.find("NCCL_IB_DISABLE="), std::string::npos);
}

TEST(FabricCli, PeerFromConfigAndBadInput) {
  auto cfg = std::filesystem::temp_directory_path() / fmt::format("dsv41_fabric_{}.env", ::getpid());
  std::ofstream(cfg) << "DSV41_MASTER_ADDR=127.0.0.1\nDSV41_WORKER_HOST=user@127.0.0.2\n";
  Result r = run("fabric --json --config " + cfg.string());
  ASSERT_EQ(r.rc, 0) << r.out;
  // This host owns 127.0.0.1 (the head), so the peer is the worker.
  EXPECT_EQ(nlohmann::json::parse(r.out)["peer"], "127.0.0.2");
  std::filesystem::remove(cfg);
  EXPECT_EQ(run("fabric --peer 999.1.1.1").rc, 1);
  EXPECT_EQ(run("fabric --json --env").rc, 1);
}
