// Every checkpoint `dsv41-serve mkmodel` can write runs through the CPU engine, in both storage
// formats (fp8: the release's FP8/FP4 layout; exl3: EXL3.md §1.8 with EXL3 linears for attention,
// wo_a slices, compressor, indexer wq_b, experts, shared experts, head and mtp.*, and F16 for the
// routers, indexer wk/weights_proj and Engram wkv), at several bit widths and codebooks.
//
// Independent check for EXL3: a "dense twin" of the checkpoint in which every EXL3 linear is
// replaced by its effective weight W (exl3::full_weight_f32, stored F32 [out, in];
// tests/support/exl3_dense_twin.h) and every other
// float tensor is re-stored as F16 where that is exact (else F32). The engine on the twin computes
// the same model through entirely different code (plain dot products instead of the Hadamard
// formulation, other dtypes for norms/embeddings), so a linear wired to the wrong tensor, a
// transposed or mis-trimmed weight, or a misread dtype shows up as a large difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dsv41/common/numeric.h"
#include "dsv41/config/model_config.h"
#include "dsv41/exl3/exl3_tensors.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "loader/manifest_build.h"
#include "model/linears.h"
#include "../support/exl3_dense_twin.h"
#include "../support/mkmodel_variants.h"
#include "../support/run_cli.h"

using namespace dsv41;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = DSV41_FIXTURES_DIR;

using Variant = test::MkmodelVariant;

std::string token_map(const Variant& v) { return kFixtures + "/" + v.fixture + "/engram_token_map.safetensors"; }

std::string work_dir(const std::string& name) {
  const std::string d = std::string(::testing::TempDir()) + "/dsv41_formats_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// mkmodel into <dir>/model; returns that folder.
std::string make_model(const Variant& v, const std::string& dir) {
  const std::string out = dir + "/model";
  const auto r = test::run_mkmodel(kFixtures, v, out);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return out;
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

bool all_finite(const TensorInfo& t) {
  const auto v = tensor_to_f32(t);
  return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
}

struct RunResult {
  std::vector<float> prefill;  // [S][V]
  std::vector<int32_t> greedy;
  std::vector<float> decode;   // [D][V]
  std::vector<int32_t> draft_ids;
  std::vector<float> draft_logits, confidence;
  std::vector<float> block0_h;  // streams after block 0 of the (one-shot) prefill
};

// Prefill (optionally in chunks), greedy decode steps and a DSpark draft after each, in-process.
// With `forced` (greedy ids of another run), the decode steps and drafts feed those tokens instead
// of this run's own argmax, so that two runs can be compared step by step.
RunResult run_model(const std::string& dir, const std::string& map, const std::vector<int32_t>& ids, int64_t decode,
                    int64_t chunk = 0, const std::vector<int32_t>* forced = nullptr) {
  model::CpuModelOptions o;
  o.engram_token_map = map;
  auto m = model::CpuModel::load(dir, o);
  const int64_t V = m->config().vocab_size;
  auto st = m->new_sequence();
  st->prompt_len = static_cast<int64_t>(ids.size());
  RunResult r;
  const int64_t S = static_cast<int64_t>(ids.size()), step = chunk > 0 ? chunk : S;
  for (int64_t p = 0; p < S; p += step) {
    std::vector<float> lg;
    const int64_t n = std::min(step, S - p);
    model::BlockDump dump;
    m->forward_sequence(*st, std::span<const int32_t>(ids.data() + p, static_cast<size_t>(n)), true, &lg,
                        p == 0 ? &dump : nullptr);
    r.prefill.insert(r.prefill.end(), lg.begin(), lg.end());
    if (p == 0) r.block0_h = dump.h.at(0);
  }
  auto argmax = [&](const float* row) { return static_cast<int32_t>(std::max_element(row, row + V) - row); };
  r.greedy.push_back(argmax(&r.prefill[(S - 1) * V]));
  auto next = [&](size_t i) { return forced ? forced->at(i) : r.greedy.at(i); };
  for (int64_t i = 0; i < decode; ++i) {
    std::vector<float> lg;
    const int32_t tok = next(static_cast<size_t>(i));
    m->forward_sequence(*st, std::span<const int32_t>(&tok, 1), false, &lg);
    r.decode.insert(r.decode.end(), lg.begin(), lg.end());
    r.greedy.push_back(argmax(lg.data()));
    if (m->has_dspark()) {
      const model::DsparkDraft d = m->dspark_draft(*st, next(static_cast<size_t>(i) + 1));
      r.draft_ids.insert(r.draft_ids.end(), d.ids.begin(), d.ids.end());
      r.draft_logits.insert(r.draft_logits.end(), d.logits.begin(), d.logits.end());
      r.confidence.insert(r.confidence.end(), d.confidence.begin(), d.confidence.end());
    }
  }
  return r;
}

// Per row of V logits: the largest |a - b| relative to the range of b's row, and whether the
// argmaxes agree. Summarised as the median error and the fraction of agreeing rows.
struct RowAgreement {
  double median_error = 1e9;
  double argmax_agree = 0.0;
};
RowAgreement compare_rows(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  EXPECT_EQ(a.size(), b.size());
  RowAgreement out;
  if (a.size() != b.size() || b.empty()) return out;
  std::vector<double> err;
  int agree = 0;
  for (size_t r = 0; r * V < b.size(); ++r) {
    const float* ra = &a[r * V];
    const float* rb = &b[r * V];
    const auto [lo, hi] = std::minmax_element(rb, rb + V);
    const double range = std::max(1e-6, static_cast<double>(*hi - *lo));
    double e = 0.0;
    for (int64_t v = 0; v < V; ++v) e = std::max(e, std::fabs(double(ra[v]) - rb[v]) / range);
    err.push_back(e);
    agree += std::max_element(ra, ra + V) - ra == std::max_element(rb, rb + V) - rb;
  }
  std::sort(err.begin(), err.end());
  out.median_error = err[err.size() / 2];
  out.argmax_agree = static_cast<double>(agree) / static_cast<double>(err.size());
  return out;
}

// ---------------------------------------------------------------------------------------------
class CheckpointFormats : public ::testing::TestWithParam<Variant> {};

// (a) `dsv41-serve logits` runs on the checkpoint (with DSpark and a chunked prefill) and writes
// finite tensors of the contract's shapes; the same run in-process gives the same greedy ids; a
// chunked prefill equals the one-shot prefill bit for bit.
TEST_P(CheckpointFormats, LogitsRunsAndChunkedPrefillMatches) {
  const Variant& v = GetParam();
  const std::string dir = work_dir(v.name);
  const std::string model = make_model(v, dir);
  const ModelConfig cfg = load_model_config(model + "/config.json");
  const int64_t V = cfg.vocab_size, S = 37, D = 3;
  const auto ids = prompt(S, V, static_cast<uint32_t>(v.seed) + 11);
  std::ofstream(dir + "/ids.json") << nlohmann::json(ids).dump();
  const std::string out = dir + "/out.safetensors";
  const auto r = test::run_cli("logits --model " + model + " --prompt-ids " + dir + "/ids.json --decode " +
                                   std::to_string(D) + " --dspark --prefill-chunk 7 --engram-token-map " +
                                   token_map(v) + " --out " + out,
                               test::Stderr::kMerge);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto f = SafetensorsFile::open(out);
  const int64_t B = cfg.dspark_block_size;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"prefill_logits", {S, V}}, {"greedy_ids", {D + 1}}, {"decode_logits", {D, V}},
      {"dspark_draft_ids", {D, B + 1}}, {"dspark_draft_logits", {D, B, V}}, {"dspark_confidence", {D, B}}};
  for (const auto& [name, shape] : want) {
    const TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    EXPECT_TRUE(all_finite(*t)) << name;
  }
  // A random model still has to produce non-degenerate logits.
  const auto pl = tensor_to_f32(*f->find("prefill_logits"));
  EXPECT_GT(*std::max_element(pl.begin(), pl.end()) - *std::min_element(pl.begin(), pl.end()), 1e-3f);

  const RunResult one = run_model(model, token_map(v), ids, D);
  const RunResult chunked = run_model(model, token_map(v), ids, D, 7);
  EXPECT_EQ(one.prefill, chunked.prefill);
  EXPECT_EQ(one.greedy, chunked.greedy);
  EXPECT_EQ(one.decode, chunked.decode);
  const auto cli_greedy = tensor_to_f32(*f->find("greedy_ids"));
  ASSERT_EQ(cli_greedy.size(), one.greedy.size());
  for (size_t i = 0; i < one.greedy.size(); ++i) EXPECT_EQ(static_cast<int32_t>(cli_greedy[i]), one.greedy[i]) << i;
  fs::remove_all(dir);
}

std::vector<Variant> all_format_variants() {
  std::vector<Variant> v = test::mkmodel_fp8_variants();
  for (const Variant& e : test::mkmodel_exl3_variants()) v.push_back(e);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Mkmodel, CheckpointFormats, ::testing::ValuesIn(all_format_variants()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
class Exl3DenseTwin : public ::testing::TestWithParam<Variant> {};

// (b) Every EXL3 linear, loaded the way the engine loads it, computes x·W of the decoder's
// effective weight; and the whole model (prefill, greedy decode, DSpark drafts) on the EXL3
// checkpoint equals the model on its dense twin.
TEST_P(Exl3DenseTwin, EngineEqualsDequantizedModel) {
  const Variant& v = GetParam();
  const std::string dir = work_dir(v.name);
  const std::string model = make_model(v, dir);
  const std::string twin = dir + "/twin";
  test::DenseTwinOptions twin_opts;
  twin_opts.widen_others = true;  // every EXL3 linear as F32, other float tensors re-stored
  const int replaced = test::write_dense_twin(model, twin, twin_opts);
  const ModelConfig cfg = load_model_config(model + "/config.json");
  const auto manifest = manifest_detail::build_manifest(cfg, CheckpointFormat::kExl3, exl3_plan_from_config(cfg));
  // head, every expert and attention projection, the wo_a slices, compressor, indexer wq_b, mtp.
  ASSERT_GT(replaced, 20);

  // Linear by linear.
  auto ck_q = Checkpoint::open(model);
  auto ck_d = Checkpoint::open(twin);
  std::mt19937 rng(v.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (const auto& lin : manifest.linears) {
    if (!ck_q->has(lin.prefix + ".trellis")) continue;
    const auto q = model::load_linear(*ck_q, lin.prefix, lin.in, lin.out);
    const auto d = model::load_linear(*ck_d, lin.prefix, lin.in, lin.out);
    std::vector<float> x(static_cast<size_t>(2 * lin.in)), yq(static_cast<size_t>(2 * lin.out)), yd(yq.size());
    for (float& f : x) f = bf16_round(nd(rng));
    q->forward(x.data(), 2, yq.data());
    d->forward(x.data(), 2, yd.data());
    float scale = 0.0f, err = 0.0f;
    for (size_t i = 0; i < yd.size(); ++i) {
      scale = std::max(scale, std::fabs(yd[i]));
      err = std::max(err, std::fabs(yq[i] - yd[i]));
    }
    EXPECT_GT(scale, 0.0f) << lin.prefix;
    EXPECT_LE(err, 1e-5f * scale + 1e-7f) << lin.prefix;
    ++checked;
  }
  EXPECT_EQ(checked, replaced);

  // Whole model. The two paths round differently in the last fp32 bits; after the first bf16
  // rounding that is a 1-ulp difference in a few activations, which the random tiny model then
  // amplifies block by block (QDQ re-quantisation, top-k and routing flips), exactly as it does
  // for any two correct implementations. So: block 0's streams must agree to a bf16 ulp almost
  // everywhere, and the logits must agree in the typical row. A miswired or misread tensor gives
  // errors of order 1 in every row (the median row error of two unrelated models is ~0.5).
  const int64_t V = cfg.vocab_size, D = 4, dim = cfg.hidden_size;
  const auto ids = prompt(40, V, static_cast<uint32_t>(v.seed) + 3);
  const RunResult a = run_model(model, token_map(v), ids, D);
  const RunResult b = run_model(twin, token_map(v), ids, D, 0, &a.greedy);
  ASSERT_EQ(a.block0_h.size(), b.block0_h.size());
  ASSERT_EQ(a.block0_h.size(), ids.size() * static_cast<size_t>(cfg.hc_mult * dim));
  // Within a few bf16 ulps of the stream's largest value (each block adds several rounded terms).
  size_t differ = 0;
  for (size_t r = 0; r * dim < a.block0_h.size(); ++r) {
    const float* x = &b.block0_h[r * dim];
    float scale = 0.0f;
    for (int64_t d = 0; d < dim; ++d) scale = std::max(scale, std::fabs(x[d]));
    for (int64_t d = 0; d < dim; ++d) {
      const size_t i = r * dim + d;
      differ += a.block0_h[i] != b.block0_h[i];
      ASSERT_LE(std::fabs(a.block0_h[i] - b.block0_h[i]), std::ldexp(scale, -5)) << "block 0 element " << i;
    }
  }
  EXPECT_LT(static_cast<double>(differ), 0.05 * static_cast<double>(a.block0_h.size()));
  const RowAgreement pre = compare_rows(a.prefill, b.prefill, V);
  EXPECT_LE(pre.median_error, 0.05);
  EXPECT_GE(pre.argmax_agree, 0.7);
  const RowAgreement dec = compare_rows(a.decode, b.decode, V);
  EXPECT_LE(dec.median_error, 0.15);
  const RowAgreement dr = compare_rows(a.draft_logits, b.draft_logits, V);
  EXPECT_LE(dr.median_error, 0.15);
  ASSERT_EQ(a.confidence.size(), b.confidence.size());
  ASSERT_FALSE(a.confidence.empty());
  std::vector<double> cerr;
  double cscale = 1e-6;
  for (size_t i = 0; i < a.confidence.size(); ++i) {
    cerr.push_back(std::fabs(a.confidence[i] - b.confidence[i]));
    cscale = std::max(cscale, std::fabs(static_cast<double>(b.confidence[i])));
  }
  std::sort(cerr.begin(), cerr.end());
  EXPECT_LE(cerr[cerr.size() / 2], 0.2 * cscale);
  std::printf("[ twin     ] prefill median row error %.4f, argmax agree %.2f; decode %.4f; drafts %.4f\n",
              pre.median_error, pre.argmax_agree, dec.median_error, dr.median_error);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Mkmodel, Exl3DenseTwin,
    ::testing::Values(Variant{"twin_mul1_b3", "tiny-s0", "--format exl3 --bits 3 --codebook mul1", 21},
                      Variant{"twin_3inst_b2", "tiny-s0", "--format exl3 --bits 2 --codebook 3inst --head-bits 4", 22},
                      Variant{"twin_mcg_b4_long", "tiny-long", "--format exl3 --bits 4 --codebook mcg --mtp-bits 5", 23}),
    [](const auto& info) { return info.param.name; });

}  // namespace
