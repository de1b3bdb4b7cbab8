// Whole-model checks of the CPU reference engine against DeepSeek's reference outputs
// (tests/fixtures/tiny-s0, tiny-long; stepping rule and tolerances in their golden.json / README):
// greedy ids identical, argmax identical at every prefill position, max |logit - golden| <=
// 1e-2 x (golden row range), DSpark draft ids identical — one-shot and in chunks of 7 and 64.
// On a failure the per-block streams name the first diverging block.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv41/loader/safetensors.h"
#include "dsv41/model/mix_gemm_parts.h"
#include "dsv41/model/cpu_model.h"

using namespace dsv41;

namespace {

struct Golden {
  std::unique_ptr<SafetensorsFile> file;
  std::vector<int32_t> prompt, greedy, draft_ids;
  std::vector<float> prefill, decode, draft_logits, draft_conf;
  std::vector<int64_t> hash_ids;
  int64_t S = 0, D = 0, V = 0;
};

std::vector<int32_t> to_i32(const TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

Golden load_golden(const std::string& dir) {
  Golden g;
  g.file = SafetensorsFile::open(dir + "/golden.safetensors");
  auto& f = *g.file;
  g.prompt = to_i32(*f.find("prompt_ids"));
  g.greedy = to_i32(*f.find("greedy_ids"));
  g.draft_ids = to_i32(*f.find("dspark_draft_ids"));
  g.prefill = tensor_to_f32(*f.find("prefill_logits"));
  g.decode = tensor_to_f32(*f.find("decode_logits"));
  g.draft_logits = tensor_to_f32(*f.find("dspark_draft_logits"));
  g.draft_conf = tensor_to_f32(*f.find("dspark_confidence"));
  const TensorInfo* h = f.find("prefill_engram_hash_ids");
  g.hash_ids.resize(static_cast<size_t>(h->numel()));
  std::memcpy(g.hash_ids.data(), h->data, g.hash_ids.size() * 8);
  g.S = static_cast<int64_t>(g.prompt.size());
  g.D = static_cast<int64_t>(g.greedy.size()) - 1;
  g.V = f.find("prefill_logits")->shape[1];
  return g;
}

struct RunResult {
  std::vector<float> prefill, decode, draft_logits, draft_conf;
  std::vector<int32_t> greedy, draft_ids;
  model::BlockDump dump;
};

int32_t argmax(const float* v, int64_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

// The fixtures' stepping rule, with the prompt prefilled in chunks of `chunk` (0 = one shot).
RunResult run_model(const std::string& dir, const Golden& g, int64_t chunk, bool corrected = false,
                    int64_t mix_gemm_k_parts = model::kMixGemmAuto) {
  model::CpuModelOptions o;
  o.corrected_index_keys = corrected;
  o.mix_gemm_k_parts = mix_gemm_k_parts;
  o.engram_token_map = dir + "/engram_token_map.safetensors";
  auto m = model::CpuModel::load(dir + "/model", o);
  RunResult r;
  auto st = m->new_sequence();
  st->prompt_len = g.S;
  const int64_t step = chunk > 0 ? chunk : g.S;
  for (int64_t s0 = 0; s0 < g.S; s0 += step) {
    const int64_t n = std::min(step, g.S - s0);
    std::vector<float> lg;
    model::BlockDump d;
    m->forward_sequence(*st, std::span<const int32_t>(g.prompt.data() + s0, static_cast<size_t>(n)), true, &lg, &d);
    r.prefill.insert(r.prefill.end(), lg.begin(), lg.end());
    if (r.dump.h.empty()) {
      r.dump.h.resize(d.h.size());
    }
    for (size_t L = 0; L < d.h.size(); ++L) r.dump.h[L].insert(r.dump.h[L].end(), d.h[L].begin(), d.h[L].end());
    r.dump.engram_hash_ids.insert(r.dump.engram_hash_ids.end(), d.engram_hash_ids.begin(), d.engram_hash_ids.end());
  }
  r.greedy.push_back(argmax(&r.prefill[(g.S - 1) * g.V], g.V));
  for (int64_t i = 0; i < g.D; ++i) {
    std::vector<float> lg;
    m->forward_sequence(*st, std::span<const int32_t>(&r.greedy[i], 1), false, &lg);
    r.decode.insert(r.decode.end(), lg.begin(), lg.end());
    r.greedy.push_back(argmax(lg.data(), g.V));
    const auto d = m->dspark_draft(*st, r.greedy.back());
    r.draft_ids.insert(r.draft_ids.end(), d.ids.begin(), d.ids.end());
    r.draft_logits.insert(r.draft_logits.end(), d.logits.begin(), d.logits.end());
    r.draft_conf.insert(r.draft_conf.end(), d.confidence.begin(), d.confidence.end());
  }
  return r;
}

// First block whose streams differ from golden by more than 3 % of the golden magnitude.
std::string first_diverging_block(const Golden& g, const RunResult& r) {
  for (size_t L = 0; L < r.dump.h.size(); ++L) {
    const TensorInfo* t = g.file->find("prefill_block" + std::to_string(L) + "_h");
    if (!t) break;
    const std::vector<float> ref = tensor_to_f32(*t);
    float err = 0, mag = 0;
    for (size_t i = 0; i < ref.size() && i < r.dump.h[L].size(); ++i) {
      err = std::max(err, std::fabs(ref[i] - r.dump.h[L][i]));
      mag = std::max(mag, std::fabs(ref[i]));
    }
    if (err > 0.03f * mag) return "first diverging block: " + std::to_string(L);
  }
  return "no block diverges";
}

// Worst |a - b| / (max - min of the golden row) over rows of width V.
double worst_rel(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  double worst = 0;
  for (size_t r0 = 0; r0 + V <= ref.size(); r0 += V) {
    const auto [mn, mx] = std::minmax_element(ref.begin() + r0, ref.begin() + r0 + V);
    const double range = *mx - *mn;
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(got[r0 + v] - ref[r0 + v]) / range);
  }
  return worst;
}

void check_fixture(const std::string& name, int64_t chunk, int64_t mix_gemm_k_parts = model::kMixGemmAuto) {
  const std::string dir = std::string(DSV41_FIXTURES_DIR) + "/" + name;
  const Golden g = load_golden(dir);
  const RunResult r = run_model(dir, g, chunk, false, mix_gemm_k_parts);
  const std::string where = first_diverging_block(g, r);
  ASSERT_EQ(r.prefill.size(), g.prefill.size());
  EXPECT_EQ(r.dump.engram_hash_ids, g.hash_ids) << "Engram hash ids differ";
  int mismatches = 0;
  for (int64_t t = 0; t < g.S; ++t)
    mismatches += argmax(&r.prefill[t * g.V], g.V) != argmax(&g.prefill[t * g.V], g.V);
  EXPECT_EQ(mismatches, 0) << "prefill argmax mismatches; " << where;
  const double pre_err = worst_rel(r.prefill, g.prefill, g.V);
  EXPECT_LE(pre_err, 1e-2) << "prefill logits; " << where;
  EXPECT_EQ(r.greedy, g.greedy) << where;
  if (r.greedy == g.greedy) {
    EXPECT_LE(worst_rel(r.decode, g.decode, g.V), 1e-2) << "decode logits";
    EXPECT_EQ(r.draft_ids, g.draft_ids) << "DSpark draft ids";
    const double dl = worst_rel(r.draft_logits, g.draft_logits, g.V);
    double ce = 0;
    for (size_t i = 0; i < g.draft_conf.size(); ++i) ce = std::max(ce, double(std::fabs(r.draft_conf[i] - g.draft_conf[i])));
    std::cout << name << " chunk " << chunk << ": prefill rel err " << pre_err << ", DSpark logits rel err " << dl
              << ", confidence max abs err " << ce << "\n";
    EXPECT_LE(dl, 1e-2) << "DSpark draft logits";
    EXPECT_LE(ce, 1e-2) << "DSpark confidence";
  }
}

}  // namespace

