// Programmatic dependent launch (kernels/ops/pdl.cuh) lets each op kernel start while the previous
// one is finishing; every kernel waits for it before touching memory. A chain of dependent ops
// launched back to back with no synchronisation between them (read-after-write and write-after-read
// on the same buffers), eagerly and replayed from a CUDA graph, must match the CPU reference run one
// op after the other.
#include <gtest/gtest.h>

#include <algorithm>

#include "harness.h"
#include "model/cpu_impl.h"
#include "model/ops/mhc.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

// Runs fn eagerly on a fresh stream `calls` times back to back, then captures `calls` more into a
// graph and replays it twice; returns false when capture or replay fails.
template <class F>
bool eager_then_graph(F fn, int calls) {
  cudaStream_t st = nullptr;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return false;
  for (int i = 0; i < calls; ++i) fn(st);
  bool ok = cudaStreamSynchronize(st) == cudaSuccess;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  ok = ok && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    for (int i = 0; i < calls; ++i) fn(st);
    ok = cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
  }
  for (int r = 0; ok && r < 2; ++r) ok = cudaGraphLaunch(ge, st) == cudaSuccess;
  ok = ok && cudaStreamSynchronize(st) == cudaSuccess;
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  cudaStreamDestroy(st);
  return ok;
}

// collapse -> in-place RMSNorm -> expand, repeated: each op reads what the previous one wrote, and
// expand overwrites the streams collapse read two launches earlier. Launched back to back (each
// with programmatic dependent launch), eagerly and from a graph, the streams must equal the CPU
// reference run one op after the other.
TEST(GpuOpsPdl, DependentChainBackToBackExact) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t hc = c.hc_mult, dim = c.hidden_size, k = hc * dim, n_mix = (2 + hc) * hc, n = 2;
    const int kSteps = 6;
    Rng rng(4242);
    const std::vector<float> h0 = rng.bf16_vec(static_cast<size_t>(n * k), 1.0f), nw = rng.bf16_vec(static_cast<size_t>(dim));
    std::vector<float> mixv = rng.f32_vec(static_cast<size_t>(n * n_mix), 0.3f);
    const float eps = static_cast<float>(c.rms_norm_eps);
    // reference: kSteps steps per call; eager_then_graph makes 1 eager call and 2 graph replays of
    // one captured call: 3 calls in all
    std::vector<float> want = h0, y(static_cast<size_t>(n * dim));
    for (int call = 0; call < 3 * kSteps; ++call)
      for (int64_t t = 0; t < n; ++t) {
        model::HcMix mx;
        std::copy_n(&mixv[t * n_mix], hc, mx.pre);
        std::copy_n(&mixv[t * n_mix + hc], hc, mx.post);
        std::copy_n(&mixv[t * n_mix + 2 * hc], hc * hc, mx.comb);
        model::hc_collapse(&want[t * k], mx.pre, hc, dim, &y[t * dim]);
        model::rms_norm(&y[t * dim], nw.data(), dim, c.rms_norm_eps, &y[t * dim]);
        model::hc_expand(&y[t * dim], &want[t * k], mx, hc, dim);
      }
    Guarded dh = Guarded::from(h0), dnw = Guarded::from(nw), dmix = Guarded::from(mixv), dy(static_cast<size_t>(n * dim) * 4);
    auto chain = [&](cudaStream_t st) {
      for (int i = 0; i < kSteps; ++i) {
        gpu::hc_collapse(gpu::HcCollapseArgs{dh.as<float>(), dmix.as<float>(), n_mix, n, hc, dim, dy.as<float>()}, st);
        gpu::rms_norm(gpu::RmsNormArgs{dy.as<float>(), dim, dnw.as<float>(), dy.as<float>(), dim, n, dim, eps}, st);
        gpu::hc_expand(gpu::HcExpandArgs{dy.as<float>(), dh.as<float>(), dmix.as<float>(), n, hc, dim}, st);
      }
    };
    ASSERT_TRUE(eager_then_graph(chain, 1)) << s.name;
    sync_ok();
    expect_equal(s.name + " chain streams", dh.host<float>(), want);
    for (const Guarded* g : {&dh, &dy}) expect_guards(s.name + " chain", *g);
  }
}

}  // namespace
}  // namespace dsv41::test
