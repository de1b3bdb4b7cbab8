// The sysfs enumerator against a recorded /sys/class/infiniband tree written into a temp dir.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dsv41/dist/fabric.h"

using namespace dsv41::dist;
namespace fs = std::filesystem;

namespace {

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

}  // namespace

TEST(FabricSysfs, ReadsDevicesPortsGidsTypesAndNetdevs) {
  fs::path root = fs::temp_directory_path() / fmt::format("dsv41_sysfs_{}", ::getpid());
  fs::remove_all(root);
  fs::path ib = root / "infiniband", net = root / "net";
  fs::path p1 = ib / "rocep1s0f1" / "ports" / "1";
  put(p1 / "state", "4: ACTIVE\n");
  put(p1 / "link_layer", "Ethernet\n");
  put(p1 / "gids" / "0", "fe80:0000:0000:0000:5e25:73ff:fe00:0b01\n");
  put(p1 / "gids" / "1", "fe80:0000:0000:0000:5e25:73ff:fe00:0b01\n");
  put(p1 / "gids" / "2", "0000:0000:0000:0000:0000:0000:0000:0000\n");  // unused slot
  put(p1 / "gids" / "3", "0000:0000:0000:0000:0000:ffff:c0a8:6402\n");
  put(p1 / "gids" / "10", "0000:0000:0000:0000:0000:ffff:c0a8:6403\n");  // numeric order after 3
  put(p1 / "gid_attrs" / "types" / "0", "IB/RoCE v1\n");
  put(p1 / "gid_attrs" / "types" / "1", "RoCE v2\n");
  put(p1 / "gid_attrs" / "types" / "3", "RoCE v2\n");
  put(p1 / "gid_attrs" / "types" / "10", "RoCE v2\n");
  for (int i : {0, 1, 3, 10}) put(p1 / "gid_attrs" / "ndevs" / std::to_string(i), "enp1s0f1np1\n");
  put(net / "enp1s0f1np1" / "mtu", "1500\n");
  fs::path p2 = ib / "mlx5_9" / "ports" / "1";
  put(p2 / "state", "1: DOWN\n");
  put(p2 / "link_layer", "InfiniBand\n");
  put(p2 / "gids" / "0", "fe80:0000:0000:0000:0002:c903:0000:1234\n");

  auto devs = read_sysfs_devices(ib.string(), net.string());
  ASSERT_EQ(devs.size(), 2u);
  EXPECT_EQ(devs[0].name, "mlx5_9");
  EXPECT_EQ(devs[1].name, "rocep1s0f1");
  const auto& r = devs[1].ports.at(0);
  EXPECT_EQ(r.port, 1);
  EXPECT_EQ(r.state, "ACTIVE");
  EXPECT_EQ(r.link_layer, "Ethernet");
  EXPECT_EQ(r.active_mtu, 1024) << "derived from netdev MTU 1500";
  ASSERT_EQ(r.gids.size(), 4u);
  EXPECT_EQ(r.gids[0].type, GidType::roce_v1);
  EXPECT_EQ(r.gids[1].type, GidType::roce_v2);
  EXPECT_EQ(r.gids[2].index, 3);
  EXPECT_EQ(r.gids[2].gid, "::ffff:192.168.100.2");
  EXPECT_EQ(r.gids[2].netdev, "enp1s0f1np1");
  EXPECT_EQ(r.gids[3].index, 10);
  const auto& i = devs[0].ports.at(0);
  EXPECT_EQ(i.state, "DOWN");
  EXPECT_EQ(i.gids.at(0).type, GidType::ib);

  // The recorded host then selects GID 3 for a peer on 192.168.100.0/24 and warns about the MTU
  // and the DOWN InfiniBand port.
  FabricInventory inv{devs, {{"enp1s0f1np1", "192.168.100.2", 24, true}}, "sysfs", {}};
  auto s = select_fabric(inv, "192.168.100.1");
  ASSERT_TRUE(s.rdma);
  EXPECT_EQ(s.gid_index, 3) << "lowest index of the matching RoCE v2 GIDs";
  bool mtu = false, down = false;
  for (const auto& w : s.warnings) {
    mtu = mtu || w.find("MTU 1024 < 4096") != std::string::npos;
    down = down || w.find("mlx5_9 port 1 is DOWN") != std::string::npos;
  }
  EXPECT_TRUE(mtu);
  EXPECT_TRUE(down);
  fs::remove_all(root);
  EXPECT_TRUE(read_sysfs_devices(ib.string(), net.string()).empty()) << "missing tree = no devices";
}
