// Text and JSON forms of `dsv41-serve fabric`.
#include <fmt/format.h>

#include "dsv41/dist/fabric.h"

namespace dsv41::dist {

nlohmann::json fabric_to_json(const FabricInventory& inv, const FabricSelection& s, const std::vector<EnvChoice>& env) {
  using nlohmann::json;
  json devs = json::array();
  for (const auto& d : inv.devices) {
    json ports = json::array();
    for (const auto& p : d.ports) {
      json gids = json::array();
      for (const auto& g : p.gids) {
        json jg = {{"index", g.index}, {"gid", g.gid}, {"type", to_string(g.type)}, {"netdev", g.netdev}};
        auto ip = gid_ipv4(g.gid);
        jg["ipv4"] = ip ? json(*ip) : json(nullptr);
        gids.push_back(std::move(jg));
      }
      ports.push_back({{"port", p.port},
                       {"state", p.state},
                       {"link_layer", p.link_layer},
                       {"active_mtu", p.active_mtu},
                       {"max_mtu", p.max_mtu},
                       {"gids", std::move(gids)}});
    }
    devs.push_back({{"name", d.name}, {"ports", std::move(ports)}});
  }
  json ifs = json::array();
  for (const auto& i : inv.interfaces)
    ifs.push_back({{"name", i.name}, {"ipv4", i.ipv4}, {"prefix_len", i.prefix_len}, {"up", i.up}});
  json selected = nullptr;
  if (s.rdma) {
    selected = {{"hca", s.hca},
                {"port", s.port},
                {"gid_index", s.gid_index >= 0 ? json(s.gid_index) : json(nullptr)},
                {"gid_type", to_string(s.gid_type)},
                {"netdev", s.netdev},
                {"ipv4", s.local_ipv4},
                {"prefix_len", s.prefix_len}};
  }
  json jenv = json::object();
  json user = json::object();
  for (const auto& c : env) {
    jenv[c.key] = c.user_set ? c.user_value : c.value;
    if (c.user_set) user[c.key] = {{"user", c.user_value}, {"fabric", c.value}};
  }
  return {{"enumerator", inv.enumerator},
          {"devices", std::move(devs)},
          {"interfaces", std::move(ifs)},
          {"peer", s.peer.empty() ? json(nullptr) : json(s.peer)},
          {"transport", s.rdma ? "rdma" : "socket"},
          {"selected", std::move(selected)},
          {"socket_ifname", s.socket_ifname.empty() ? json(nullptr) : json(s.socket_ifname)},
          {"env", std::move(jenv)},
          {"env_user_set", std::move(user)},
          {"summary", s.summary},
          {"warnings", s.warnings},
          {"notes", inv.notes}};
}

std::string fabric_to_text(const FabricInventory& inv, const FabricSelection& s, const std::vector<EnvChoice>& env) {
  std::string out;
  if (inv.devices.empty()) {
    out += "RDMA devices: none found";
    out += inv.enumerator == "none" ? "\n" : fmt::format(" ({})\n", inv.enumerator);
  } else {
    out += fmt::format("RDMA devices ({}):\n", inv.enumerator);
    for (const auto& d : inv.devices) {
      out += fmt::format("  {}\n", d.name);
      for (const auto& p : d.ports) {
        out += fmt::format("    port {}: {}, {}, MTU {} (max {})\n", p.port, p.state, p.link_layer,
                           p.active_mtu ? std::to_string(p.active_mtu) : "?",
                           p.max_mtu ? std::to_string(p.max_mtu) : "?");
        for (const auto& g : p.gids)
          out += fmt::format("      GID {:>3}  {:<8} {:<40} {}\n", g.index, to_string(g.type), g.gid,
                             g.netdev.empty() ? "-" : g.netdev);
      }
    }
  }
  for (const auto& n : inv.notes) out += fmt::format("note: {}\n", n);
  out += "IPv4 interfaces:\n";
  for (const auto& i : inv.interfaces)
    out += fmt::format("  {:<16} {}/{}{}\n", i.name, i.ipv4, i.prefix_len, i.up ? "" : " (down)");
  out += fmt::format("peer: {}\n", s.peer.empty() ? "(none given; use --peer IP or --config FILE)" : s.peer);
  out += fmt::format("choice: {}\n", s.summary);
  out += "environment for NCCL/Gloo:\n";
  for (const auto& c : env) {
    if (c.user_set)
      out += fmt::format("  {}={}   (set by the user, kept; fabric would use {})\n", c.key, c.user_value, c.value);
    else
      out += fmt::format("  {}={}\n", c.key, c.value);
  }
  for (const auto& w : s.warnings) out += fmt::format("warning: {}\n", w);
  return out;
}

std::string fabric_env_lines(const std::vector<EnvChoice>& env) {
  std::string out;
  for (const auto& c : env) out += fmt::format("{}={}\n", c.key, c.user_set ? c.user_value : c.value);
  return out;
}

}  // namespace dsv41::dist
