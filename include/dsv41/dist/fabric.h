// The RDMA fabric between the two ranks: what devices/ports/GIDs exist (enumeration, from
// libibverbs or sysfs), which one reaches the peer (selection, pure and tested against recorded
// device tables), and the NCCL/Gloo environment that follows from the choice.
//
// Selection rule: among RoCE GIDs that carry an IPv4-mapped address, take those whose address is
// on the peer's subnet (netmask of the interface holding that address); prefer an ACTIVE port,
// then RoCE v2 over v1, then the lowest device name / port / GID index. DOWN ports are never
// chosen. Without a usable port NCCL is told to use TCP sockets (NCCL_IB_DISABLE=1) on the
// interface that reaches the peer.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv41::dist {

enum class GidType { ib, roce_v1, roce_v2, unknown };
const char* to_string(GidType t);
GidType parse_gid_type(std::string_view sysfs_text);  // "IB/RoCE v1", "RoCE v2", "IB"

struct FabricGid {
  int index = 0;
  std::string gid;  // canonical IPv6 text (inet_ntop), e.g. "::ffff:10.0.0.1" or "fe80::..."
  GidType type = GidType::unknown;
  std::string netdev;  // "" when the kernel reports none
};

struct FabricPort {
  int port = 1;
  std::string state;       // ACTIVE, DOWN, INIT, ARMED, ...
  std::string link_layer;  // Ethernet (RoCE) or InfiniBand
  int active_mtu = 0;      // bytes; 0 = unknown
  int max_mtu = 0;         // bytes; 0 = unknown
  std::vector<FabricGid> gids;
  bool active() const { return state == "ACTIVE"; }
};

struct FabricDevice {
  std::string name;
  std::vector<FabricPort> ports;
};

struct NetInterface {
  std::string name;
  std::string ipv4;
  int prefix_len = 32;
  bool up = true;
};

struct FabricInventory {
  std::vector<FabricDevice> devices;
  std::vector<NetInterface> interfaces;  // IPv4 addresses of this host
  std::string enumerator;                // "libibverbs", "sysfs" or "none"
  std::vector<std::string> notes;
};

struct FabricSelection {
  std::string peer;  // IPv4 the choice was made for ("" = none given)
  bool rdma = false;
  std::string hca;
  int port = 0;
  int gid_index = -1;  // -1: not applicable (InfiniBand link layer)
  GidType gid_type = GidType::unknown;
  std::string netdev;
  std::string local_ipv4;
  int prefix_len = 0;
  std::string socket_ifname;  // interface for NCCL/Gloo bootstrap sockets ("" = let them pick)
  std::vector<std::pair<std::string, std::string>> env;  // NCCL_*/GLOO_* to use, in print order
  std::vector<std::string> warnings;
  std::string summary;  // one sentence: what was chosen and why
};

// --- IPv4 / GID helpers ----------------------------------------------------------------------
std::optional<uint32_t> parse_ipv4(std::string_view text);  // host byte order
std::string format_ipv4(uint32_t addr);
bool same_subnet(uint32_t a, uint32_t b, int prefix_len);
// Canonical text of a GID given as sysfs text ("fe80:0000:...") or any IPv6 text; nullopt if invalid.
std::optional<std::string> canonical_gid(std::string_view text);
// The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else nullopt.
std::optional<std::string> gid_ipv4(std::string_view gid);
// Bytes of an IB MTU enum value (1 = 256 ... 5 = 4096); 0 for unknown.
int ib_mtu_bytes(int ib_mtu_enum);
// RoCE active MTU implied by an Ethernet netdev MTU (largest IB MTU that fits with headers).
int roce_mtu_for_netdev_mtu(int netdev_mtu);

// --- Selection (pure) ---------------------------------------------------------------------------
// `peer` may be empty; otherwise it must be an IPv4 address (dsv41::Error if not).
FabricSelection select_fabric(const FabricInventory& inv, const std::string& peer);

// --- Environment --------------------------------------------------------------------------------
struct EnvChoice {
  std::string key;
  std::string value;       // what the fabric choice says
  bool user_set = false;   // already set in the environment: the user's value wins
  std::string user_value;
};
std::vector<EnvChoice> resolve_fabric_env(const FabricSelection& s,
                                          const std::function<const char*(const char*)>& getenv_fn);
// What the server does at start: sets every variable of the choice the user has not set.
// Returns the decisions (for the log).
std::vector<EnvChoice> apply_fabric_env(const FabricSelection& s);

// What the server/worker calls once before creating the NCCL communicator (and before Gloo/TCP
// bootstrap): enumerate this host, select for `peer` (the other rank's IPv4; "" if unknown), set
// the variables the user has not set, and log the choice, the warnings and every variable.
FabricSelection configure_fabric_env(const std::string& peer);

// --- Enumeration (this host) ------------------------------------------------------------------
// libibverbs when built with it (DSV41_HAS_IBVERBS) and it lists devices, else sysfs; plus the
// host's IPv4 interfaces (getifaddrs). Never throws for "no devices".
FabricInventory enumerate_fabric();
// Reads <ib_root>/<dev>/ports/<p>/{state,link_layer,gids/<i>,gid_attrs/types/<i>,gid_attrs/ndevs/<i>}
// and the netdev MTU from <net_root>/<netdev>/mtu (RoCE active MTU is derived from it).
std::vector<FabricDevice> read_sysfs_devices(const std::string& ib_root = "/sys/class/infiniband",
                                             const std::string& net_root = "/sys/class/net");
std::vector<NetInterface> list_ipv4_interfaces();

// --- Output ------------------------------------------------------------------------------------
nlohmann::json fabric_to_json(const FabricInventory& inv, const FabricSelection& s,
                              const std::vector<EnvChoice>& env);
std::string fabric_to_text(const FabricInventory& inv, const FabricSelection& s, const std::vector<EnvChoice>& env);
// KEY=VALUE lines (bash-sourceable) of the environment to use, user-set values kept.
std::string fabric_env_lines(const std::vector<EnvChoice>& env);

}  // namespace dsv41::dist
