// `dsv41-serve fabric [--json] [--env] [--peer IP] [--config FILE]`: RDMA devices of this host, the
// HCA/port/GID that reaches the peer, and the NCCL/Gloo environment that follows.
#include <netdb.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/config/env_file.h"
#include "dsv41/dist/fabric.h"

namespace dsv41::cli {
namespace {

struct FabricOptions {
  bool json = false;
  bool env = false;
  std::string peer;
  std::string config;
};

// "user@host" (an ssh destination) -> "host"; hostnames -> first IPv4 address.
std::string resolve_peer(std::string peer) {
  if (auto at = peer.rfind('@'); at != std::string::npos) peer = peer.substr(at + 1);
  if (peer.empty() || dist::parse_ipv4(peer)) return peer;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(peer.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) fail("cannot resolve peer '{}' to an IPv4 address: {}", peer, ::gai_strerror(rc));
  uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr);
  ::freeaddrinfo(res);
  return dist::format_ipv4(a);
}

// With a config file and no --peer: the head's peer is the worker, the worker's peer is the head.
std::string peer_from_config(const config::EnvFile& f, const dist::FabricInventory& inv) {
  std::string master = f.get("DSV41_MASTER_ADDR");
  std::string worker = f.get("DSV41_WORKER_ADDR", f.get("DSV41_WORKER_HOST"));
  if (auto at = worker.rfind('@'); at != std::string::npos) worker = worker.substr(at + 1);
  bool this_is_head = false;
  for (const auto& i : inv.interfaces)
    if (!master.empty() && i.ipv4 == master) this_is_head = true;
  if (this_is_head) return worker;
  return master;
}

int run_fabric(const FabricOptions& o) {
  if (o.json && o.env) fail("--json and --env are exclusive");
  dist::FabricInventory inv = dist::enumerate_fabric();
  std::string peer = o.peer;
  if (peer.empty() && !o.config.empty()) peer = peer_from_config(config::parse_env_file(o.config), inv);
  peer = resolve_peer(peer);
  dist::FabricSelection sel = dist::select_fabric(inv, peer);
  auto env = dist::resolve_fabric_env(sel, [](const char* k) -> const char* { return std::getenv(k); });
  if (o.json) {
    std::printf("%s\n", dist::fabric_to_json(inv, sel, env).dump(2).c_str());
  } else if (o.env) {
    std::printf("%s", dist::fabric_env_lines(env).c_str());
    for (const auto& w : sel.warnings) std::fprintf(stderr, "dsv41-serve fabric: warning: %s\n", w.c_str());
    std::fprintf(stderr, "dsv41-serve fabric: %s\n", sel.summary.c_str());
  } else {
    std::printf("%s", dist::fabric_to_text(inv, sel, env).c_str());
  }
  return 0;
}

}  // namespace

Command add_fabric(CLI::App& root) {
  auto opts = std::make_shared<FabricOptions>();
  CLI::App* app = root.add_subcommand(
      "fabric", "RDMA devices, the HCA/port/GID that reaches the peer, and the NCCL/Gloo environment to use");
  app->add_flag("--json", opts->json, "Print JSON");
  app->add_flag("--env", opts->env, "Print only KEY=VALUE lines of the environment (for the launcher)");
  app->add_option("--peer", opts->peer, "The other rank's address (IPv4 or host name)");
  app->add_option("--config", opts->config,
                  "Configuration file: the peer is DSV41_WORKER_ADDR/HOST on the head, DSV41_MASTER_ADDR elsewhere");
  return Command{app, [opts] { return run_fabric(*opts); }};
}

}  // namespace dsv41::cli
