// The DSpark drafter on the CUDA backend: `dsv41-serve logits --device cuda --dspark` on tiny-s0
// and the drafts after every decode step on tiny-long (with the fixture's 3-part mixes GEMM, as
// the CPU engine's reference test) against DeepSeek's reference outputs, with the CPU engine's
// acceptance (draft ids identical, draft logits within 1e-2 of the golden row range, confidence
// within 1e-2); the same drafts against the CPU engine's; and a batched draft over sequences at
// different positions (inside and beyond the window) equal to their drafts one by one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/run_cli.h"
#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "model_check.h"

using namespace dsv41;

namespace {

std::string fixture(const std::string& name) { return std::string(DSV41_FIXTURES_DIR) + "/" + name; }
std::string tmp(const std::string& name) { return std::string(::testing::TempDir()) + "/dsv41_gpu_dspark_" + name; }

std::vector<int32_t> i32(const TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

struct Drafts {
  std::vector<int32_t> greedy, ids;
  std::vector<float> logits, conf;
};

Drafts golden_drafts(const std::string& name) {
  auto g = SafetensorsFile::open(fixture(name) + "/golden.safetensors");
  Drafts d;
  d.greedy = i32(*g->find("greedy_ids"));
  d.ids = i32(*g->find("dspark_draft_ids"));
  d.logits = tensor_to_f32(*g->find("dspark_draft_logits"));
  d.conf = tensor_to_f32(*g->find("dspark_confidence"));
  return d;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) e = std::max(e, double(std::fabs(a[i] - b[i])));
  return e;
}

void expect_matches(const std::string& what, const Drafts& got, const Drafts& want, int64_t V, double logit_tol,
                    double conf_tol) {
  EXPECT_EQ(got.greedy, want.greedy) << what << ": greedy ids";
  ASSERT_FALSE(want.ids.empty());
  EXPECT_EQ(got.ids, want.ids) << what << ": DSpark draft ids";
  const double dl = test::worst_rel(got.logits, want.logits, V), ce = max_abs_diff(got.conf, want.conf);
  EXPECT_LE(dl, logit_tol) << what << ": DSpark draft logits";
  EXPECT_LE(ce, conf_tol) << what << ": DSpark confidence";
  std::cout << what << ": draft logits rel err " << dl << " (bit-identical " << test::identical_fraction(got.logits, want.logits)
            << "), confidence max abs err " << ce << "\n";
}

// The fixtures' stepping rule with a draft after every decode step (anchor = the step's argmax).
template <class M>
Drafts run_with_drafts(M& m, const std::vector<int32_t>& prompt, int64_t decode) {
  const int64_t V = m.config().vocab_size;
  auto st = m.new_sequence();
  st->prompt_len = static_cast<int64_t>(prompt.size());
  std::vector<float> lg;
  m.forward_sequence(*st, prompt, false, &lg);
  Drafts d;
  d.greedy.push_back(test::argmax_row(lg.data(), V));
  for (int64_t i = 0; i < decode; ++i) {
    m.forward_sequence(*st, std::span<const int32_t>(&d.greedy.back(), 1), false, &lg);
    d.greedy.push_back(test::argmax_row(lg.data(), V));
    const model::DsparkDraft x = m.dspark_draft(*st, d.greedy.back());
    d.ids.insert(d.ids.end(), x.ids.begin(), x.ids.end());
    d.logits.insert(d.logits.end(), x.logits.begin(), x.logits.end());
    d.conf.insert(d.conf.end(), x.confidence.begin(), x.confidence.end());
  }
  return d;
}

model::CudaModelOptions cuda_options(const std::string& name, int64_t parts = 0) {
  model::CudaModelOptions o;
  o.engram_token_map = fixture(name) + "/engram_token_map.safetensors";
  o.mix_gemm_k_parts = parts;
  o.exact_block_sums = true;  // sequential block sums, no grouped MoE: drafts compared with the CPU engine bit for bit
  return o;
}

}  // namespace

TEST(GpuDspark, LogitsCliMatchesTinyS0Fixture) {
  auto g = SafetensorsFile::open(fixture("tiny-s0") + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*g->find("prompt_ids"));
  const Drafts want = golden_drafts("tiny-s0");
  const int64_t V = g->find("prefill_logits")->shape[1], N = static_cast<int64_t>(want.greedy.size()) - 1;
  const std::string ids = tmp("prompt.json"), out = tmp("out.safetensors");
  std::ofstream(ids) << nlohmann::json(prompt).dump();
  std::filesystem::remove(out);
  const auto r = test::run_cli("logits --device cuda --dspark --model " + fixture("tiny-s0") + "/model --engram-token-map " +
                                   fixture("tiny-s0") + "/engram_token_map.safetensors --prompt-ids " + ids +
                                   " --decode " + std::to_string(N) + " --out " + out,
                               test::Stderr::kMerge);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto f = SafetensorsFile::open(out);
  ASSERT_NE(f->find("dspark_draft_ids"), nullptr);
  EXPECT_EQ(f->find("dspark_draft_ids")->shape, g->find("dspark_draft_ids")->shape);
  EXPECT_EQ(f->find("dspark_draft_logits")->shape, g->find("dspark_draft_logits")->shape);
  EXPECT_EQ(f->find("dspark_confidence")->shape, g->find("dspark_confidence")->shape);
  Drafts got;
  got.greedy = i32(*f->find("greedy_ids"));
  got.ids = i32(*f->find("dspark_draft_ids"));
  got.logits = tensor_to_f32(*f->find("dspark_draft_logits"));
  got.conf = tensor_to_f32(*f->find("dspark_confidence"));
  expect_matches("tiny-s0 cli", got, want, V, 1e-2, 1e-2);
}

TEST(GpuDspark, TinyLongDraftsMatchFixture) {
  auto g = SafetensorsFile::open(fixture("tiny-long") + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*g->find("prompt_ids"));
  const Drafts want = golden_drafts("tiny-long");
  const int64_t N = static_cast<int64_t>(want.greedy.size()) - 1;
  auto m = model::CudaModel::load(fixture("tiny-long") + "/model", cuda_options("tiny-long", 3));
  ASSERT_TRUE(m->has_dspark());
  expect_matches("tiny-long", run_with_drafts(*m, prompt, N), want, m->config().vocab_size, 1e-2, 1e-2);
}

// Same drafts as the CPU engine (which the GPU mirrors operation by operation): ids identical,
// logits and confidence to float noise at most.
TEST(GpuDspark, DraftsMatchCpuEngine) {
  auto g = SafetensorsFile::open(fixture("tiny-s0") + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*g->find("prompt_ids"));
  model::CpuModelOptions co;
  co.engram_token_map = fixture("tiny-s0") + "/engram_token_map.safetensors";
  auto cpu = model::CpuModel::load(fixture("tiny-s0") + "/model", co);
  auto gpu = model::CudaModel::load(fixture("tiny-s0") + "/model", cuda_options("tiny-s0"));
  // A prompt shorter than the window (ring partly empty) and the fixture prompt (ring wrapped).
  for (size_t len : {size_t{5}, prompt.size()}) {
    const std::vector<int32_t> p(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(len));
    const Drafts want = run_with_drafts(*cpu, p, 6);
    expect_matches("cpu vs gpu, prompt " + std::to_string(len), run_with_drafts(*gpu, p, 6), want,
                   gpu->config().vocab_size, 1e-4, 1e-4);
  }
}

// One batched pass over sequences at different positions gives each its own draft, bit for bit.
TEST(GpuDspark, BatchedDraftEqualsSingleDrafts) {
  auto g = SafetensorsFile::open(fixture("tiny-s0") + "/golden.safetensors");
  const std::vector<int32_t> prompt = i32(*g->find("prompt_ids"));
  model::CudaModelOptions o = cuda_options("tiny-s0");
  o.max_chunk_tokens = 8;  // several drafter passes for the batch (4 sequences of 2 rows per pass)
  auto m = model::CudaModel::load(fixture("tiny-s0") + "/model", o);
  std::vector<std::unique_ptr<SeqState>> states;
  std::vector<const SeqState*> ptrs;
  std::vector<int32_t> anchors;
  for (int i = 0; i < 7; ++i) {
    const size_t len = 3 + static_cast<size_t>(i) * 13;  // 3 .. 81 tokens: inside and beyond the window
    auto st = m->new_sequence();
    st->prompt_len = static_cast<int64_t>(len);
    std::vector<float> lg;
    m->forward_sequence(*st, std::span<const int32_t>(prompt.data(), len), false, &lg);
    anchors.push_back(test::argmax_row(lg.data(), m->config().vocab_size));
    ptrs.push_back(st.get());
    states.push_back(std::move(st));
  }
  const std::vector<model::DsparkDraft> batch = m->dspark_draft_batch(ptrs, anchors);
  ASSERT_EQ(batch.size(), states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    const model::DsparkDraft one = m->dspark_draft(*states[i], anchors[i]);
    EXPECT_EQ(batch[i].ids, one.ids) << "sequence " << i;
    EXPECT_EQ(batch[i].logits, one.logits) << "sequence " << i;
    EXPECT_EQ(batch[i].confidence, one.confidence) << "sequence " << i;
    EXPECT_EQ(batch[i].ids.front(), anchors[i]);
  }
  EXPECT_THROW(m->dspark_draft(*states[0], -1), Error);
}
