#include "bench/layer_extrapolation.h"

#include <functional>

#include "dsv41/common/error.h"

namespace dsv41::bench {

LayerKind layer_kind(const ModelConfig& c, int64_t layer) {
  LayerKind k;
  k.ratio = c.ratio(layer);
  k.kv_source = k.ratio > 0 && c.is_kv_source(layer);
  k.index_source = k.ratio > 0 && c.is_index_source(layer);
  k.engram = c.is_engram_layer(layer);
  return k;
}

std::string describe(const LayerKind& k) {
  std::string s = "ratio " + std::to_string(k.ratio);
  if (k.kv_source && k.index_source) s += ", KV + index source";
  else if (k.kv_source) s += ", KV source";
  else if (k.index_source) s += ", index source";
  if (k.engram) s += ", Engram";
  return s;
}

LayerExtrapolation extrapolate_layers(const ModelConfig& loaded, const std::vector<double>& measured_ms,
                                      const ModelConfig& full) {
  const int64_t n = loaded.num_hidden_layers;
  DSV_CHECK(static_cast<int64_t>(measured_ms.size()) == n, "layer extrapolation: {} times for {} layers",
            measured_ms.size(), n);
  DSV_CHECK(n > 0, "layer extrapolation: no measured layers");
  std::vector<LayerKind> mk;
  for (int64_t i = 0; i < n; ++i) mk.push_back(layer_kind(loaded, i));
  auto without_engram = [](LayerKind k) {
    k.engram = false;
    return k;
  };
  auto mean_of = [&](const std::vector<int64_t>& ids) {
    double s = 0;
    for (int64_t i : ids) s += measured_ms[static_cast<size_t>(i)];
    return s / static_cast<double>(ids.size());
  };
  auto measured_where = [&](const std::function<bool(const LayerKind&)>& pred) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i)
      if (pred(mk[static_cast<size_t>(i)])) ids.push_back(i);
    return ids;
  };

  LayerExtrapolation ex;
  double engram_sum = 0;
  int64_t engram_pairs = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!mk[static_cast<size_t>(i)].engram) continue;
    const LayerKind base = without_engram(mk[static_cast<size_t>(i)]);
    const std::vector<int64_t> twins = measured_where([&](const LayerKind& k) { return k == base; });
    if (twins.empty()) continue;
    engram_sum += measured_ms[static_cast<size_t>(i)] - mean_of(twins);
    ++engram_pairs;
  }
  ex.engram_measured = engram_pairs > 0;
  ex.engram_ms = ex.engram_measured ? engram_sum / static_cast<double>(engram_pairs) : 0.0;

  for (int64_t L = 0; L < full.num_hidden_layers; ++L) {
    const LayerKind k = layer_kind(full, L);
    KindEstimate* e = nullptr;
    for (KindEstimate& x : ex.kinds)
      if (x.kind == k) e = &x;
    if (!e) {
      KindEstimate est;
      est.kind = k;
      est.measured = measured_where([&](const LayerKind& m) { return m == k; });
      est.exact = !est.measured.empty();
      if (!est.exact) {
        const LayerKind base = without_engram(k);
        const std::vector<std::function<bool(const LayerKind&)>> fallbacks{
            [&](const LayerKind& m) { return m == base; },
            [&](const LayerKind& m) { return !m.engram && m.ratio == k.ratio; },
            [&](const LayerKind& m) { return !m.engram && (m.ratio > 0) == (k.ratio > 0); },
            [&](const LayerKind& m) { return !m.engram; },
            [](const LayerKind&) { return true; },
        };
        for (const auto& f : fallbacks) {
          est.measured = measured_where(f);
          if (!est.measured.empty()) break;
        }
        est.plus_engram = k.engram && !mk[static_cast<size_t>(est.measured.front())].engram;
      }
      est.ms = mean_of(est.measured) + (est.plus_engram ? ex.engram_ms : 0.0);
      ex.kinds.push_back(est);
      e = &ex.kinds.back();
    }
    ++e->count;
    ex.total_ms += e->ms;
  }
  return ex;
}

}  // namespace dsv41::bench
