// Fabric selection against recorded/fake device tables.
#include <gtest/gtest.h>

#include <map>

#include "dsv41/common/error.h"
#include "dsv41/dist/fabric.h"

using namespace dsv41::dist;

namespace {

FabricGid gid(int index, const std::string& text, GidType type, const std::string& netdev) {
  return FabricGid{index, *canonical_gid(text), type, netdev};
}

// A DGX Spark-like ConnectX-7: two RoCE ports, each with the usual 4 GIDs (v1/v2 link-local,
// v1/v2 IPv4-mapped), the two ports on different subnets.
FabricInventory two_port_spark() {
  FabricInventory inv;
  inv.enumerator = "recorded";
  FabricDevice d0{"rocep1s0f0", {}};
  FabricPort p0{1, "ACTIVE", "Ethernet", 4096, 4096, {}};
  p0.gids = {gid(0, "fe80:0000:0000:0000:5e25:73ff:fe00:0a01", GidType::roce_v1, "enp1s0f0np0"),
             gid(1, "fe80:0000:0000:0000:5e25:73ff:fe00:0a01", GidType::roce_v2, "enp1s0f0np0"),
             gid(2, "0000:0000:0000:0000:0000:ffff:c0a8:6401", GidType::roce_v1, "enp1s0f0np0"),   // 192.168.100.1
             gid(3, "0000:0000:0000:0000:0000:ffff:c0a8:6401", GidType::roce_v2, "enp1s0f0np0")};
  d0.ports.push_back(p0);
  FabricDevice d1{"rocep1s0f1", {}};
  FabricPort p1{1, "ACTIVE", "Ethernet", 4096, 4096, {}};
  p1.gids = {gid(0, "fe80::5e25:73ff:fe00:0b01", GidType::roce_v1, "enp1s0f1np1"),
             gid(1, "fe80::5e25:73ff:fe00:0b01", GidType::roce_v2, "enp1s0f1np1"),
             gid(2, "::ffff:10.10.0.1", GidType::roce_v1, "enp1s0f1np1"),
             gid(3, "::ffff:10.10.0.1", GidType::roce_v2, "enp1s0f1np1")};
  d1.ports.push_back(p1);
  inv.devices = {d0, d1};
  inv.interfaces = {{"lo", "127.0.0.1", 8, true},
                    {"enP7s7", "172.16.5.20", 16, true},
                    {"enp1s0f0np0", "192.168.100.1", 24, true},
                    {"enp1s0f1np1", "10.10.0.1", 16, true}};
  return inv;
}

std::map<std::string, std::string> env_of(const FabricSelection& s) { return {s.env.begin(), s.env.end()}; }

bool has_warning(const FabricSelection& s, const std::string& needle) {
  for (const auto& w : s.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(FabricHelpers, AddressesAndMtus) {
  EXPECT_EQ(gid_ipv4(*canonical_gid("0000:0000:0000:0000:0000:ffff:0a00:0001")), "10.0.0.1");
  EXPECT_EQ(gid_ipv4("fe80::1"), std::nullopt);
  EXPECT_EQ(canonical_gid("fe80:0000:0000:0000:0000:0000:0000:0001\n"), "fe80::1");
  EXPECT_EQ(canonical_gid("zz"), std::nullopt);
  EXPECT_TRUE(same_subnet(*parse_ipv4("10.10.3.4"), *parse_ipv4("10.10.200.1"), 16));
  EXPECT_FALSE(same_subnet(*parse_ipv4("10.10.3.4"), *parse_ipv4("10.11.0.1"), 16));
  EXPECT_FALSE(same_subnet(*parse_ipv4("10.0.0.1"), *parse_ipv4("10.0.0.2"), 32));
  EXPECT_EQ(parse_ipv4("300.1.1.1"), std::nullopt);
  EXPECT_EQ(format_ipv4(*parse_ipv4("192.168.100.2")), "192.168.100.2");
  EXPECT_EQ(ib_mtu_bytes(5), 4096);
  EXPECT_EQ(ib_mtu_bytes(3), 1024);
  EXPECT_EQ(roce_mtu_for_netdev_mtu(9000), 4096);
  EXPECT_EQ(roce_mtu_for_netdev_mtu(1500), 1024);
  EXPECT_EQ(parse_gid_type("RoCE v2\n"), GidType::roce_v2);
  EXPECT_EQ(parse_gid_type("IB/RoCE v1"), GidType::roce_v1);
}

TEST(FabricSelect, PicksThePortOnThePeersSubnetWithRoceV2) {
  auto inv = two_port_spark();
  auto s = select_fabric(inv, "192.168.100.2");
  ASSERT_TRUE(s.rdma) << s.summary;
  EXPECT_EQ(s.hca, "rocep1s0f0");
  EXPECT_EQ(s.port, 1);
  EXPECT_EQ(s.gid_index, 3);
  EXPECT_EQ(s.gid_type, GidType::roce_v2);
  EXPECT_EQ(s.netdev, "enp1s0f0np0");
  auto env = env_of(s);
  EXPECT_EQ(env["NCCL_IB_HCA"], "rocep1s0f0:1");
  EXPECT_EQ(env["NCCL_IB_GID_INDEX"], "3");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "enp1s0f0np0");
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "enp1s0f0np0");
  EXPECT_EQ(env["NCCL_IB_DISABLE"], "0");
  EXPECT_TRUE(s.warnings.empty()) << s.warnings.front();

  // The other subnet picks the other device (/16 there).
  auto t = select_fabric(inv, "10.10.77.9");
  ASSERT_TRUE(t.rdma);
  EXPECT_EQ(t.hca, "rocep1s0f1");
  EXPECT_EQ(t.gid_index, 3);
  EXPECT_EQ(env_of(t)["NCCL_SOCKET_IFNAME"], "enp1s0f1np1");
}

TEST(FabricSelect, RoceV1OnlyIsUsedWithAWarning) {
  auto inv = two_port_spark();
  auto& g = inv.devices[0].ports[0].gids;
  g.erase(g.begin() + 3);  // drop the v2 IPv4 GID
  auto s = select_fabric(inv, "192.168.100.2");
  ASSERT_TRUE(s.rdma);
  EXPECT_EQ(s.gid_index, 2);
  EXPECT_EQ(s.gid_type, GidType::roce_v1);
  EXPECT_TRUE(has_warning(s, "only a RoCE v1 GID fits"));
}

TEST(FabricSelect, LinkLocalGidsAloneCannotReachAnIpv4Peer) {
  auto inv = two_port_spark();
  for (auto& d : inv.devices)
    for (auto& p : d.ports) p.gids.resize(2);  // only fe80:: GIDs remain
  auto s = select_fabric(inv, "192.168.100.2");
  EXPECT_FALSE(s.rdma);
  auto env = env_of(s);
  EXPECT_EQ(env["NCCL_IB_DISABLE"], "1");
  EXPECT_EQ(env.count("NCCL_IB_HCA"), 0u);
  // The socket transport still uses the interface that reaches the peer.
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "enp1s0f0np0");
  EXPECT_TRUE(has_warning(s, "NCCL falls back to TCP sockets"));
}

TEST(FabricSelect, DownPortIsNeverChosenAndIsReported) {
  auto inv = two_port_spark();
  inv.devices[0].ports[0].state = "DOWN";
  auto s = select_fabric(inv, "192.168.100.2");
  EXPECT_FALSE(s.rdma) << s.summary;
  EXPECT_TRUE(has_warning(s, "rocep1s0f0 port 1 is DOWN"));
  EXPECT_TRUE(has_warning(s, "on the peer's subnet but the port is DOWN"));
  EXPECT_EQ(env_of(s)["NCCL_IB_DISABLE"], "1");
  // The other port is unaffected for its own peer.
  auto t = select_fabric(inv, "10.10.0.2");
  EXPECT_TRUE(t.rdma);
  EXPECT_EQ(t.hca, "rocep1s0f1");
}

TEST(FabricSelect, SmallMtuWarns) {
  auto inv = two_port_spark();
  inv.devices[0].ports[0].active_mtu = 1024;
  auto s = select_fabric(inv, "192.168.100.2");
  EXPECT_TRUE(s.rdma);
  EXPECT_TRUE(has_warning(s, "rocep1s0f0 port 1 runs with MTU 1024 < 4096"));
  EXPECT_FALSE(has_warning(s, "rocep1s0f1 port 1 runs with MTU"));
}

TEST(FabricSelect, NoDevicesFallsBackToSockets) {
  FabricInventory inv;
  inv.enumerator = "none";
  inv.interfaces = {{"lo", "127.0.0.1", 8, true}, {"eth0", "192.0.2.2", 24, true}};
  auto s = select_fabric(inv, "192.0.2.77");
  EXPECT_FALSE(s.rdma);
  EXPECT_NE(s.summary.find("no RDMA devices found"), std::string::npos);
  auto env = env_of(s);
  EXPECT_EQ(env["NCCL_IB_DISABLE"], "1");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth0");
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "eth0");
  // A loopback peer (single-host run) uses lo; lo never serves a remote peer.
  EXPECT_EQ(env_of(select_fabric(inv, "127.0.0.1"))["NCCL_SOCKET_IFNAME"], "lo");
  FabricInventory wide = inv;
  wide.interfaces[0].prefix_len = 0;  // a (bogus) catch-all loopback netmask
  EXPECT_EQ(env_of(select_fabric(wide, "203.0.113.9")).count("NCCL_SOCKET_IFNAME"), 0u);
  // Without a peer nothing names an interface.
  auto t = select_fabric(inv, "");
  EXPECT_EQ(env_of(t).count("NCCL_SOCKET_IFNAME"), 0u);
  EXPECT_EQ(env_of(t)["NCCL_IB_DISABLE"], "1");
}

TEST(FabricSelect, NoPeerPicksFirstActiveV2WithAWarningInTheSummary) {
  auto inv = two_port_spark();
  auto s = select_fabric(inv, "");
  ASSERT_TRUE(s.rdma);
  EXPECT_EQ(s.hca, "rocep1s0f0");
  EXPECT_EQ(s.gid_index, 3);
  EXPECT_NE(s.summary.find("no peer address given"), std::string::npos);
}

TEST(FabricSelect, PeerOnNoSubnetAndBadPeer) {
  auto inv = two_port_spark();
  auto s = select_fabric(inv, "8.8.8.8");
  EXPECT_FALSE(s.rdma);
  EXPECT_TRUE(has_warning(s, "no local interface is on the peer 8.8.8.8's subnet"));
  EXPECT_THROW(select_fabric(inv, "fe80::1"), dsv41::Error);
  EXPECT_THROW(select_fabric(inv, "spark-2"), dsv41::Error);
}

TEST(FabricSelect, InfinibandPortUsedWhenNoRoceGidFits) {
  FabricInventory inv;
  FabricPort p{1, "ACTIVE", "InfiniBand", 4096, 4096, {gid(0, "fe80::2", GidType::ib, "")}};
  inv.devices = {{"mlx5_0", {p}}};
  inv.interfaces = {{"ib0", "10.1.0.5", 24, true}};
  auto s = select_fabric(inv, "10.1.0.6");
  ASSERT_TRUE(s.rdma);
  auto env = env_of(s);
  EXPECT_EQ(env["NCCL_IB_HCA"], "mlx5_0:1");
  EXPECT_EQ(env.count("NCCL_IB_GID_INDEX"), 0u);
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "ib0");
}

TEST(FabricEnv, UserSetVariablesWin) {
  auto s = select_fabric(two_port_spark(), "192.168.100.2");
  std::map<std::string, std::string> user = {{"NCCL_IB_GID_INDEX", "5"}};
  auto env = resolve_fabric_env(s, [&](const char* k) -> const char* {
    auto it = user.find(k);
    return it == user.end() ? nullptr : it->second.c_str();
  });
  bool seen = false;
  for (const auto& c : env) {
    if (c.key == "NCCL_IB_GID_INDEX") {
      seen = true;
      EXPECT_TRUE(c.user_set);
      EXPECT_EQ(c.user_value, "5");
      EXPECT_EQ(c.value, "3");
    } else {
      EXPECT_FALSE(c.user_set) << c.key;
    }
  }
  EXPECT_TRUE(seen);
  std::string lines = fabric_env_lines(env);
  EXPECT_NE(lines.find("NCCL_IB_GID_INDEX=5\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find("NCCL_IB_HCA=rocep1s0f0:1\n"), std::string::npos) << lines;
  auto j = fabric_to_json(two_port_spark(), s, env);
  EXPECT_EQ(j["env"]["NCCL_IB_GID_INDEX"], "5");
  EXPECT_EQ(j["env_user_set"]["NCCL_IB_GID_INDEX"]["fabric"], "3");
  EXPECT_EQ(j["selected"]["hca"], "rocep1s0f0");
  EXPECT_EQ(j["transport"], "rdma");
  EXPECT_EQ(j["devices"][0]["ports"][0]["gids"][3]["ipv4"], "192.168.100.1");
  std::string text = fabric_to_text(two_port_spark(), s, env);
  EXPECT_NE(text.find("set by the user, kept"), std::string::npos) << text;
}

TEST(FabricEnv, ConfigureSetsOnlyUnsetVariables) {
  // This host's real inventory; whatever it selects, a user-set variable must survive and the
  // variables of the choice must be set afterwards.
  ::setenv("NCCL_IB_DISABLE", "user-value", 1);
  ::unsetenv("NCCL_SOCKET_IFNAME");
  FabricSelection s = configure_fabric_env("");
  EXPECT_STREQ(std::getenv("NCCL_IB_DISABLE"), "user-value");
  for (const auto& [k, v] : s.env) {
    if (k == "NCCL_IB_DISABLE") continue;
    ASSERT_NE(std::getenv(k.c_str()), nullptr) << k;
    EXPECT_EQ(std::string(std::getenv(k.c_str())), v) << k;
  }
  for (const auto& [k, v] : s.env) ::unsetenv(k.c_str());
}
