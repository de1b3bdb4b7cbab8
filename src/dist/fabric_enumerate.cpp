// Fabric enumeration on this host: libibverbs (when built with it), sysfs otherwise, getifaddrs
// for the IPv4 addresses and netmasks.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsv41/dist/fabric.h"

#if defined(DSV41_HAS_IBVERBS)
#include <infiniband/verbs.h>
#endif

namespace fs = std::filesystem;

namespace dsv41::dist {
namespace {

// Contents of a small sysfs file without the trailing newline; nullopt if it cannot be read
// (unused GID slots return EINVAL on read).
std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool is_zero_gid(const std::string& canonical) { return canonical == "::"; }

std::vector<std::string> sorted_entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    // numeric order for numeric names (gid indices, port numbers)
    bool na = !a.empty() && std::all_of(a.begin(), a.end(), ::isdigit);
    bool nb = !b.empty() && std::all_of(b.begin(), b.end(), ::isdigit);
    if (na && nb) return std::stol(a) < std::stol(b);
    return a < b;
  });
  return names;
}

// sysfs state file: "4: ACTIVE"
std::string state_word(const std::string& s) {
  auto p = s.find(':');
  std::string w = p == std::string::npos ? s : s.substr(p + 1);
  while (!w.empty() && w.front() == ' ') w.erase(w.begin());
  return w;
}

int netdev_mtu(const std::string& net_root, const std::string& netdev) {
  if (netdev.empty()) return 0;
  auto t = read_text(fs::path(net_root) / netdev / "mtu");
  if (!t) return 0;
  try {
    return std::stoi(*t);
  } catch (...) {
    return 0;
  }
}

// GID type and netdev of one GID slot from sysfs (also used to complete libibverbs data).
void sysfs_gid_attrs(const fs::path& port_dir, int index, FabricGid& g) {
  if (auto t = read_text(port_dir / "gid_attrs" / "types" / std::to_string(index))) g.type = parse_gid_type(*t);
  if (auto n = read_text(port_dir / "gid_attrs" / "ndevs" / std::to_string(index))) g.netdev = *n;
}

#if defined(DSV41_HAS_IBVERBS)
std::string port_state_name(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
  }
}

std::vector<FabricDevice> read_ibverbs_devices(std::vector<std::string>& notes) {
  std::vector<FabricDevice> out;
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    int err = errno;
    notes.push_back(err == ENOSYS ? std::string("libibverbs: the kernel/container exposes no RDMA subsystem")
                                  : fmt::format("libibverbs: cannot list devices ({})", std::strerror(err)));
    return out;
  }
  if (n == 0) notes.push_back("libibverbs: no RDMA devices");
  for (int i = 0; i < n; ++i) {
    FabricDevice dev;
    dev.name = ibv_get_device_name(list[i]);
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) {
      notes.push_back(fmt::format("libibverbs: cannot open {} ({})", dev.name, std::strerror(errno)));
      out.push_back(std::move(dev));
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) {
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, uint8_t(p), &pa) != 0) continue;
        FabricPort port;
        port.port = p;
        port.state = port_state_name(pa.state);
        port.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
        port.active_mtu = ib_mtu_bytes(int(pa.active_mtu));
        port.max_mtu = ib_mtu_bytes(int(pa.max_mtu));
        fs::path port_dir = fs::path("/sys/class/infiniband") / dev.name / "ports" / std::to_string(p);
        for (int gi = 0; gi < pa.gid_tbl_len; ++gi) {
          FabricGid g;
          g.index = gi;
          ibv_gid_entry e{};
          if (ibv_query_gid_ex(ctx, uint32_t(p), uint32_t(gi), &e, 0) == 0) {
            char buf[INET6_ADDRSTRLEN];
            if (!inet_ntop(AF_INET6, e.gid.raw, buf, sizeof buf)) continue;
            g.gid = buf;
            g.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::roce_v2
                     : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::roce_v1
                                                          : GidType::ib;
            if (e.ndev_ifindex != 0) {
              char ifname[IF_NAMESIZE] = {};
              if (if_indextoname(e.ndev_ifindex, ifname)) g.netdev = ifname;
            }
          } else {
            // Unused slots fail with ENODATA; older kernels lack the ioctl: fall back to plain
            // ibv_query_gid + sysfs attributes.
            if (errno == ENODATA) continue;
            ibv_gid raw{};
            if (ibv_query_gid(ctx, uint8_t(p), gi, &raw) != 0) continue;
            char buf[INET6_ADDRSTRLEN];
            if (!inet_ntop(AF_INET6, raw.raw, buf, sizeof buf)) continue;
            g.gid = buf;
            sysfs_gid_attrs(port_dir, gi, g);
          }
          if (is_zero_gid(g.gid)) continue;
          port.gids.push_back(std::move(g));
        }
        dev.ports.push_back(std::move(port));
      }
    } else {
      notes.push_back(fmt::format("libibverbs: cannot query {}", dev.name));
    }
    ibv_close_device(ctx);
    out.push_back(std::move(dev));
  }
  ibv_free_device_list(list);
  return out;
}
#endif

}  // namespace

std::vector<FabricDevice> read_sysfs_devices(const std::string& ib_root, const std::string& net_root) {
  std::vector<FabricDevice> out;
  std::error_code ec;
  if (!fs::is_directory(ib_root, ec)) return out;
  for (const auto& name : sorted_entries(ib_root)) {
    FabricDevice dev;
    dev.name = name;
    fs::path ports = fs::path(ib_root) / name / "ports";
    for (const auto& pn : sorted_entries(ports)) {
      FabricPort port;
      try {
        port.port = std::stoi(pn);
      } catch (...) {
        continue;
      }
      fs::path pd = ports / pn;
      port.state = state_word(read_text(pd / "state").value_or("?"));
      port.link_layer = read_text(pd / "link_layer").value_or("");
      for (const auto& gn : sorted_entries(pd / "gids")) {
        FabricGid g;
        try {
          g.index = std::stoi(gn);
        } catch (...) {
          continue;
        }
        auto text = read_text(pd / "gids" / gn);
        if (!text) continue;
        auto canon = canonical_gid(*text);
        if (!canon || is_zero_gid(*canon)) continue;
        g.gid = *canon;
        sysfs_gid_attrs(pd, g.index, g);
        if (g.type == GidType::unknown && port.link_layer == "InfiniBand") g.type = GidType::ib;
        port.gids.push_back(std::move(g));
      }
      // sysfs has no active MTU; for RoCE it follows the netdev MTU.
      if (port.link_layer == "Ethernet") {
        for (const auto& g : port.gids) {
          int m = netdev_mtu(net_root, g.netdev);
          if (m > 0) {
            port.active_mtu = roce_mtu_for_netdev_mtu(m);
            break;
          }
        }
        port.max_mtu = 4096;
      }
      dev.ports.push_back(std::move(port));
    }
    out.push_back(std::move(dev));
  }
  return out;
}

std::vector<NetInterface> list_ipv4_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return out;
  for (ifaddrs* p = ifa; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET) continue;
    NetInterface ni;
    ni.name = p->ifa_name;
    uint32_t addr = ntohl(reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr.s_addr);
    ni.ipv4 = format_ipv4(addr);
    ni.prefix_len = 32;
    if (p->ifa_netmask) {
      uint32_t mask = ntohl(reinterpret_cast<sockaddr_in*>(p->ifa_netmask)->sin_addr.s_addr);
      ni.prefix_len = __builtin_popcount(mask);
    }
    ni.up = (p->ifa_flags & IFF_UP) != 0;
    out.push_back(std::move(ni));
  }
  freeifaddrs(ifa);
  return out;
}

FabricInventory enumerate_fabric() {
  FabricInventory inv;
  inv.interfaces = list_ipv4_interfaces();
#if defined(DSV41_HAS_IBVERBS)
  inv.devices = read_ibverbs_devices(inv.notes);
  inv.enumerator = "libibverbs";
  if (!inv.devices.empty()) return inv;
#else
  inv.notes.push_back("built without libibverbs: devices read from sysfs");
#endif
  inv.devices = read_sysfs_devices();
  inv.enumerator = inv.devices.empty() ? "none" : "sysfs";
  return inv;
}

}  // namespace dsv41::dist
