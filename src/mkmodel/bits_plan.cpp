#include "mkmodel/bits_plan.h"

#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"

namespace dsv41::mkmodel {

namespace {

struct Group {
  std::string key;
  int64_t layer = 0;
  int kind = 0;  // 0 attention, 1 shared expert, 2 routed experts, 3 other
  uint64_t weights = 0;
  std::vector<std::string> prefixes;
  std::vector<uint64_t> sizes;  // weights per prefix
};

int kind_of(const std::string& prefix) {
  if (prefix.find(".attn.") != std::string::npos) return 0;
  if (prefix.find(".ffn.shared_experts.") != std::string::npos) return 1;
  if (prefix.find(".ffn.experts.") != std::string::npos) return 2;
  return 3;
}

}  // namespace

BitsPlanResult plan_bits(const ModelConfig& cfg, double bits, int head_bits, int mtp_bits, const std::string& codebook) {
  if (!(bits >= 1.0 && bits <= 8.0)) fail("--bits {} out of range (1 to 8, fractional allowed)", bits);
  if (!((head_bits >= 1 && head_bits <= 8) || head_bits == 16))
    fail("--head-bits {} out of range (1..8, or 16 for an unquantized head)", head_bits);
  if (mtp_bits < 1 || mtp_bits > 8) fail("--mtp-bits {} out of range (1..8)", mtp_bits);
  BitsPlanResult res;
  const int base = static_cast<int>(std::floor(bits));
  res.plan.default_bits = base;
  res.plan.head_bits = head_bits;
  res.plan.mtp_bits = mtp_bits;
  res.plan.codebook = codebook;

  // The quantized linears and their padded sizes, from the manifest itself.
  std::map<std::string, Group> groups;
  for (const TensorSpec& t : expected_tensors(cfg, CheckpointFormat::kExl3, res.plan)) {
    if (!t.exl3_trellis) continue;
    const std::string& p = t.exl3_linear;
    if (p == "head" || p.rfind("mtp.", 0) == 0) continue;
    const uint64_t w = static_cast<uint64_t>(t.shape[0]) * 16u * static_cast<uint64_t>(t.shape[1]) * 16u;
    int64_t layer = -1;
    if (p.rfind("layers.", 0) == 0) layer = std::stoll(p.substr(7, p.find('.', 7) - 7));
    const int kind = kind_of(p);
    const std::string key = std::to_string(layer) + "/" + std::to_string(kind);
    Group& g = groups[key];
    g.key = key;
    g.layer = layer;
    g.kind = kind;
    g.weights += w;
    g.prefixes.push_back(p);
    g.sizes.push_back(w);
    res.budgeted_weights += w;
  }
  std::vector<Group*> order;
  for (auto& [k, g] : groups) order.push_back(&g);
  const int64_t nl = cfg.num_hidden_layers;
  auto edge_distance = [&](int64_t l) { return l < 0 ? 0 : std::min(l, nl - 1 - l); };
  std::sort(order.begin(), order.end(), [&](const Group* a, const Group* b) {
    const int64_t da = edge_distance(a->layer), db = edge_distance(b->layer);
    if (da != db) return da < db;
    if (a->layer != b->layer) return a->layer < b->layer;
    return a->kind < b->kind;
  });
  // Extra bit budget beyond floor(bits), in weight-bits. Pass 1: whole groups that fit get +1.
  // Pass 2 (when large groups left budget unused, e.g. few layers): the remaining groups'
  // smaller units in the same priority order, one expert (its w1/w2/w3 together) or one other
  // linear at a time, so the mean lands close to the target.
  double extra = (bits - base) * static_cast<double>(res.budgeted_weights);
  uint64_t total_bits = static_cast<uint64_t>(base) * res.budgeted_weights;
  for (const auto& [k, g] : groups)
    for (const auto& p : g.prefixes) res.plan.per_linear[p] = base;
  if (base < 8) {
    std::vector<Group*> rest;
    for (Group* g : order) {
      if (static_cast<double>(g->weights) <= extra + 1e-6) {
        extra -= static_cast<double>(g->weights);
        total_bits += g->weights;
        for (const auto& p : g->prefixes) res.plan.per_linear[p] = base + 1;
      } else {
        rest.push_back(g);
      }
    }
    for (Group* g : rest) {
      std::map<std::string, std::pair<uint64_t, std::vector<std::string>>> units;  // key -> (weights, prefixes)
      std::vector<std::string> unit_order;
      for (size_t i = 0; i < g->prefixes.size(); ++i) {
        const std::string& p = g->prefixes[i];
        const size_t e = p.find(".experts.");
        const std::string key = e == std::string::npos ? p : p.substr(0, p.find('.', e + 9));
        if (!units.count(key)) unit_order.push_back(key);
        units[key].first += g->sizes[i];
        units[key].second.push_back(p);
      }
      for (const auto& key : unit_order) {
        const auto& [w, ps] = units[key];
        if (static_cast<double>(w) > extra + 1e-6) continue;
        extra -= static_cast<double>(w);
        total_bits += w;
        for (const auto& p : ps) res.plan.per_linear[p] = base + 1;
      }
    }
  }
  res.achieved_bits =
      res.budgeted_weights ? static_cast<double>(total_bits) / static_cast<double>(res.budgeted_weights) : bits;
  return res;
}

}  // namespace dsv41::mkmodel
