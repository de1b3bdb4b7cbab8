// Fabric selection: pure functions over a FabricInventory (tested with recorded device tables).
#include <arpa/inet.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "dsv41/common/error.h"
#include "dsv41/dist/fabric.h"

namespace dsv41::dist {

const char* to_string(GidType t) {
  switch (t) {
    case GidType::ib: return "IB";
    case GidType::roce_v1: return "RoCE v1";
    case GidType::roce_v2: return "RoCE v2";
    case GidType::unknown: break;
  }
  return "unknown";
}

GidType parse_gid_type(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  if (s == "RoCE v2") return GidType::roce_v2;
  if (s == "IB/RoCE v1" || s == "RoCE v1") return GidType::roce_v1;
  if (s == "IB") return GidType::ib;
  return GidType::unknown;
}

std::optional<uint32_t> parse_ipv4(std::string_view text) {
  std::string s(text);
  in_addr a{};
  if (s.empty() || ::inet_pton(AF_INET, s.c_str(), &a) != 1) return std::nullopt;
  return ntohl(a.s_addr);
}

std::string format_ipv4(uint32_t addr) {
  return fmt::format("{}.{}.{}.{}", addr >> 24, (addr >> 16) & 255, (addr >> 8) & 255, addr & 255);
}

bool same_subnet(uint32_t a, uint32_t b, int prefix_len) {
  if (prefix_len <= 0) return true;
  if (prefix_len >= 32) return a == b;
  uint32_t mask = ~uint32_t(0) << (32 - prefix_len);
  return (a & mask) == (b & mask);
}

std::optional<std::string> canonical_gid(std::string_view text) {
  std::string s(text);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  in6_addr a{};
  if (s.empty() || ::inet_pton(AF_INET6, s.c_str(), &a) != 1) return std::nullopt;
  char buf[INET6_ADDRSTRLEN];
  if (!::inet_ntop(AF_INET6, &a, buf, sizeof buf)) return std::nullopt;
  return std::string(buf);
}

std::optional<std::string> gid_ipv4(std::string_view gid) {
  std::string s(gid);
  in6_addr a{};
  if (::inet_pton(AF_INET6, s.c_str(), &a) != 1) return std::nullopt;
  static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(a.s6_addr, prefix, 12) != 0) return std::nullopt;
  return fmt::format("{}.{}.{}.{}", a.s6_addr[12], a.s6_addr[13], a.s6_addr[14], a.s6_addr[15]);
}

int ib_mtu_bytes(int e) { return e >= 1 && e <= 5 ? 256 << (e - 1) : 0; }

int roce_mtu_for_netdev_mtu(int netdev_mtu) {
  // RoCE v2 frame overhead inside the Ethernet MTU: IPv4/UDP/BTH/ICRC and extended headers.
  constexpr int kOverhead = 96;
  for (int m = 4096; m >= 256; m /= 2)
    if (m + kOverhead <= netdev_mtu) return m;
  return 0;
}

namespace {

struct Candidate {
  const FabricDevice* dev;
  const FabricPort* port;
  const FabricGid* gid;
  std::string ipv4;
  int prefix_len;
  std::string netdev;
};

// Prefix length of `ip` on this host (prefer the interface the GID names), -1 if not found.
int prefix_of(const FabricInventory& inv, const std::string& ip, const std::string& netdev, std::string* ifname) {
  const NetInterface* best = nullptr;
  for (const auto& i : inv.interfaces) {
    if (i.ipv4 != ip) continue;
    if (!best || i.name == netdev) best = &i;
  }
  if (!best) return -1;
  if (ifname) *ifname = best->name;
  return best->prefix_len;
}

int type_rank(GidType t) {
  switch (t) {
    case GidType::roce_v2: return 0;
    case GidType::roce_v1: return 1;
    default: return 2;
  }
}

std::string where(const Candidate& c) {
  return fmt::format("{} port {} GID {} ({}, {}{})", c.dev->name, c.port->port, c.gid->index, to_string(c.gid->type),
                     c.ipv4, c.netdev.empty() ? "" : " on " + c.netdev);
}

}  // namespace

FabricSelection select_fabric(const FabricInventory& inv, const std::string& peer_text) {
  FabricSelection s;
  s.peer = peer_text;
  std::optional<uint32_t> peer;
  if (!peer_text.empty()) {
    peer = parse_ipv4(peer_text);
    if (!peer) fail("peer address '{}' is not an IPv4 address", peer_text);
  }

  // Port-level warnings (every port, chosen or not).
  for (const auto& d : inv.devices)
    for (const auto& p : d.ports) {
      if (!p.active())
        s.warnings.push_back(fmt::format("{} port {} is {} (link layer {})", d.name, p.port,
                                         p.state.empty() ? "in an unknown state" : p.state, p.link_layer));
      else if (p.active_mtu > 0 && p.active_mtu < 4096)
        s.warnings.push_back(fmt::format(
            "{} port {} runs with MTU {} < 4096: RDMA bandwidth suffers; raise the netdev MTU (e.g. 9000)", d.name,
            p.port, p.active_mtu));
    }

  std::vector<Candidate> all;
  for (const auto& d : inv.devices)
    for (const auto& p : d.ports) {
      if (p.link_layer != "Ethernet") continue;
      for (const auto& g : p.gids) {
        auto ip = gid_ipv4(g.gid);
        if (!ip) continue;  // link-local / IPv6 GIDs cannot reach an IPv4 peer
        std::string ifname = g.netdev;
        int prefix = prefix_of(inv, *ip, g.netdev, &ifname);
        all.push_back({&d, &p, &g, *ip, prefix, ifname});
      }
    }

  std::vector<Candidate> usable;
  for (const auto& c : all) {
    if (peer) {
      if (c.prefix_len < 0) continue;  // address not configured on this host: cannot judge
      if (!same_subnet(*parse_ipv4(c.ipv4), *peer, c.prefix_len)) continue;
    }
    if (!c.port->active()) {
      if (peer)
        s.warnings.push_back(fmt::format("{} is on the peer's subnet but the port is {}: not used", where(c),
                                         c.port->state));
      continue;
    }
    usable.push_back(c);
  }
  std::sort(usable.begin(), usable.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(type_rank(a.gid->type), a.dev->name, a.port->port, a.gid->index) <
           std::make_tuple(type_rank(b.gid->type), b.dev->name, b.port->port, b.gid->index);
  });

  // An ACTIVE InfiniBand port needs no IP match (IB routes by LID); used when no RoCE GID fits.
  const FabricDevice* ib_dev = nullptr;
  const FabricPort* ib_port = nullptr;
  for (const auto& d : inv.devices)
    for (const auto& p : d.ports)
      if (!ib_dev && p.link_layer == "InfiniBand" && p.active()) ib_dev = &d, ib_port = &p;

  // Interface that reaches the peer (for bootstrap sockets, and the fallback transport).
  std::string peer_if;
  if (peer)
    for (const auto& i : inv.interfaces)
      // Loopback only reaches a loopback peer (single-host runs).
      if (i.up && same_subnet(*parse_ipv4(i.ipv4), *peer, i.prefix_len) &&
          ((*parse_ipv4(i.ipv4) >> 24) != 127 || (*peer >> 24) == 127)) {
        peer_if = i.name;
        break;
      }

  if (!usable.empty()) {
    const Candidate& c = usable.front();
    s.rdma = true;
    s.hca = c.dev->name;
    s.port = c.port->port;
    s.gid_index = c.gid->index;
    s.gid_type = c.gid->type;
    s.netdev = c.netdev;
    s.local_ipv4 = c.ipv4;
    s.prefix_len = c.prefix_len;
    s.socket_ifname = c.netdev.empty() ? peer_if : c.netdev;
    if (c.gid->type != GidType::roce_v2)
      s.warnings.push_back(fmt::format("{}: only a {} GID fits; RoCE v2 is expected on DGX Spark", where(c),
                                       to_string(c.gid->type)));
    s.summary = peer ? fmt::format("RDMA via {}: its address is on the peer {}'s subnet /{}", where(c), peer_text,
                                   c.prefix_len)
                     : fmt::format("RDMA via {} (no peer address given: chosen without a reachability check; "
                                   "pass --peer IP)", where(c));
  } else if (ib_dev) {
    s.rdma = true;
    s.hca = ib_dev->name;
    s.port = ib_port->port;
    s.socket_ifname = peer_if;
    s.summary = fmt::format("RDMA via {} port {} (InfiniBand link layer, no RoCE GID on the peer's subnet)",
                            ib_dev->name, ib_port->port);
  } else {
    s.socket_ifname = peer_if;
    if (inv.devices.empty())
      s.summary = "no RDMA devices found: NCCL falls back to TCP sockets (NCCL_IB_DISABLE=1)";
    else if (peer)
      s.summary = fmt::format(
          "no ACTIVE RDMA port has an IPv4 GID on the peer {}'s subnet: NCCL falls back to TCP sockets "
          "(NCCL_IB_DISABLE=1)", peer_text);
    else
      s.summary = "no ACTIVE RDMA port with an IPv4 (RoCE) GID: NCCL falls back to TCP sockets (NCCL_IB_DISABLE=1)";
    if (!inv.devices.empty()) s.warnings.push_back(s.summary);
    if (peer && peer_if.empty())
      s.warnings.push_back(fmt::format("no local interface is on the peer {}'s subnet; the socket transport will "
                                       "use the default route", peer_text));
  }

  if (s.rdma) {
    s.env.emplace_back("NCCL_IB_DISABLE", "0");
    s.env.emplace_back("NCCL_IB_HCA", fmt::format("{}:{}", s.hca, s.port));
    if (s.gid_index >= 0) s.env.emplace_back("NCCL_IB_GID_INDEX", std::to_string(s.gid_index));
  } else {
    s.env.emplace_back("NCCL_IB_DISABLE", "1");
  }
  if (!s.socket_ifname.empty()) {
    s.env.emplace_back("NCCL_SOCKET_IFNAME", s.socket_ifname);
    s.env.emplace_back("GLOO_SOCKET_IFNAME", s.socket_ifname);
  }
  return s;
}

std::vector<EnvChoice> resolve_fabric_env(const FabricSelection& s,
                                          const std::function<const char*(const char*)>& getenv_fn) {
  std::vector<EnvChoice> out;
  for (const auto& [k, v] : s.env) {
    EnvChoice c{k, v, false, {}};
    if (const char* u = getenv_fn(k.c_str()); u != nullptr) {
      c.user_set = true;
      c.user_value = u;
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<EnvChoice> apply_fabric_env(const FabricSelection& s) {
  auto env = resolve_fabric_env(s, [](const char* k) -> const char* { return std::getenv(k); });
  for (const auto& c : env)
    if (!c.user_set) ::setenv(c.key.c_str(), c.value.c_str(), 0);
  return env;
}

FabricSelection configure_fabric_env(const std::string& peer) {
  FabricInventory inv = enumerate_fabric();
  FabricSelection s = select_fabric(inv, peer);
  spdlog::info("fabric: {}", s.summary);
  for (const auto& w : s.warnings) spdlog::warn("fabric: {}", w);
  for (const auto& c : apply_fabric_env(s)) {
    if (c.user_set)
      spdlog::info("fabric: {}={} (set by the user; the fabric choice would be {})", c.key, c.user_value, c.value);
    else
      spdlog::info("fabric: {}={}", c.key, c.value);
  }
  return s;
}

}  // namespace dsv41::dist
