// The DSpark ops against the CPU reference engine's expressions (src/model/cpu_model.cpp): the
// target-layer tap (stream mean, bf16) and the Markov head's bias added to the drafter logits
// (unfused fp32 multiply-add chain over the rank). Both must be bit-exact; real and tiny shapes,
// BF16 and F32 heads, an out-of-vocabulary id (NaN row), guard bytes.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

TEST(GpuOps, StreamMeanExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t n = 37, hc = c.hc_mult, dim = c.hidden_size;
    const int64_t nt = std::max<int64_t>(1, static_cast<int64_t>(c.dspark_target_layer_ids.size()));
    const int64_t stride = nt * dim, slot = nt - 1;  // the last tap slot of a [n][nt][dim] buffer
    Rng rng(5);
    std::vector<float> h = rng.bf16_vec(static_cast<size_t>(n * hc * dim), 4.0f);
    h[3] = INFINITY;
    std::vector<float> want(static_cast<size_t>(n * stride), 0.0f);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += h[static_cast<size_t>((t * hc + j) * dim + d)];
        want[static_cast<size_t>(t * stride + slot * dim + d)] = bf16_round(acc / static_cast<float>(hc));
      }
    DeviceBuffer dh = DeviceBuffer::from(h);
    Guarded out = Guarded::from(std::vector<float>(static_cast<size_t>(n * stride), 0.0f));
    gpu::StreamMeanArgs a{dh.as<float>(), n, hc, dim, out.as<float>() + slot * dim, stride};
    gpu::stream_mean(a, nullptr);
    sync_ok();
    expect_equal(s.name + " stream_mean", out.host<float>(), want);
    expect_guards(s.name + " stream_mean", out);
    if (s.name == "real") report_time("stream_mean real n=37", time_us([&] { gpu::stream_mean(a, nullptr); }));
  }
}

TEST(GpuOps, MarkovBiasExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t V = c.vocab_size, rank = c.dspark_markov_rank > 0 ? c.dspark_markov_rank : 256;
    const int64_t rows = 11, stride = V + 5;
    for (const bool f32_head : {false, true}) {
      Rng rng(f32_head ? 9 : 8);
      std::vector<float> head = f32_head ? rng.f32_vec(static_cast<size_t>(V * rank), 0.05f)
                                         : rng.bf16_vec(static_cast<size_t>(V * rank), 0.05f);
      std::vector<float> embed = rng.bf16_vec(static_cast<size_t>(V * rank), 1.0f);
      std::vector<float> logits = rng.f32_vec(static_cast<size_t>(rows * stride), 2.0f);
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      for (auto& id : ids) id = static_cast<int32_t>(rng.below(V));
      ids[4] = static_cast<int32_t>(V);  // outside the vocabulary: a NaN row
      // Reference (cpu_model.cpp dspark_draft): acc += w[v][k] * e[k] from zero, then logit += acc.
      std::vector<float> want = logits;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = 0; v < V; ++v) {
          if (ids[static_cast<size_t>(r)] >= V) {
            want[static_cast<size_t>(r * stride + v)] = NAN;
            continue;
          }
          const float* e = &embed[static_cast<size_t>(ids[static_cast<size_t>(r)] * rank)];
          float acc = 0.0f;
          for (int64_t k = 0; k < rank; ++k) acc += head[static_cast<size_t>(v * rank + k)] * e[k];
          want[static_cast<size_t>(r * stride + v)] += acc;
        }
      std::vector<float> head_t(head.size());
      for (int64_t v = 0; v < V; ++v)
        for (int64_t k = 0; k < rank; ++k) head_t[static_cast<size_t>(k * V + v)] = head[static_cast<size_t>(v * rank + k)];
      DeviceBuffer dhead = f32_head ? DeviceBuffer::from(head_t) : DeviceBuffer::from(to_bf16_bits(head_t));
      DeviceBuffer demb = DeviceBuffer::from(to_bf16_bits(embed));
      DeviceBuffer dids = DeviceBuffer::from(ids);
      Guarded dl = Guarded::from(logits);
      gpu::MarkovBiasArgs a;
      a.logits = dl.as<float>();
      a.rows = rows;
      a.vocab = V;
      a.rank = rank;
      a.logits_stride = stride;
      a.head_t = dhead.get();
      a.head_type = f32_head ? gpu::DenseType::F32 : gpu::DenseType::BF16;
      a.embed = demb.get();
      a.embed_type = gpu::DenseType::BF16;
      a.ids = dids.as<int32_t>();
      gpu::markov_bias(a, nullptr);
      sync_ok();
      std::vector<float> got = dl.host<float>();
      const std::string what = s.name + (f32_head ? " markov_bias f32" : " markov_bias bf16");
      // The padding columns past the vocabulary stay as they were.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = V; v < stride; ++v)
          EXPECT_EQ(got[static_cast<size_t>(r * stride + v)], logits[static_cast<size_t>(r * stride + v)]) << what;
      expect_close(what, got, want, 0.0);
      size_t exact = 0;
      for (size_t i = 0; i < got.size(); ++i) exact += std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i];
      EXPECT_EQ(exact, got.size()) << what << ": not bit-exact";
      expect_guards(what, dl);
    }
  }
}

}  // namespace
}  // namespace dsv41::test
