// The ops are asynchronous, allocate nothing and can be captured in a CUDA graph (decode steps run
// as graphs): a decode-shaped sequence (RMSNorm, ActQuant8, Lin8, router, indexer scores, top-k,
// sparse attention) run eagerly and replayed from a captured graph must give identical bits.
#include <gtest/gtest.h>

#include "harness.h"
#include "model/ops/quant.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

TEST(GpuOps, GraphCaptureReplayIdentical) {
  const Shapes& s = shape_sets()[0];
  const ModelConfig& c = s.cfg;
  const int64_t dim = c.hidden_size, qlr = c.q_lora_rank, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, win = c.sliding_window, IH = c.index_n_heads,
                ID = c.index_head_dim, T = 3000, tk = c.index_topk;
  Rng rng(123);
  DeviceBuffer x = DeviceBuffer::from(rng.bf16_vec(static_cast<size_t>(dim))), nw = DeviceBuffer::from(rng.bf16_vec(static_cast<size_t>(dim)));
  DeviceBuffer xn(static_cast<size_t>(dim) * 4), codes(static_cast<size_t>(dim)), scales(static_cast<size_t>(dim / 32) * 4);
  DeviceBuffer w8 = DeviceBuffer::from(rng.e4m3_bytes(static_cast<size_t>(qlr * dim)));
  DeviceBuffer w8s = DeviceBuffer::from(rng.e8m0_bytes(static_cast<size_t>(((qlr + 31) / 32) * (dim / 32))));
  DeviceBuffer y(static_cast<size_t>(qlr) * 4);
  DeviceBuffer gw = DeviceBuffer::from(rng.f32_vec(static_cast<size_t>(E * dim), 0.01f)), gb = DeviceBuffer::from(rng.f32_vec(static_cast<size_t>(E), 0.1f));
  DeviceBuffer ids(static_cast<size_t>(K) * 4), wts(static_cast<size_t>(K) * 4), rscratch(static_cast<size_t>(2 * E) * 4);
  std::vector<float> keys = rng.bf16_vec(static_cast<size_t>(T * ID));
  for (int64_t r = 0; r < T; ++r) model::qdq4a_inplace(&keys[r * ID], ID);
  DeviceBuffer dkeys = DeviceBuffer::from(to_bf16_bits(keys)), qi = DeviceBuffer::from(rng.bf16_vec(static_cast<size_t>(IH * ID)));
  DeviceBuffer iw = DeviceBuffer::from(rng.bf16_vec(static_cast<size_t>(IH), 0.1f)), scores(static_cast<size_t>(T) * 4);
  DeviceBuffer sel(static_cast<size_t>(tk) * 4), list(static_cast<size_t>(win + tk) * 4);
  DeviceBuffer ring = DeviceBuffer::from(to_bf16_bits(rng.bf16_vec(static_cast<size_t>(win * hd))));
  DeviceBuffer comp = DeviceBuffer::from(to_bf16_bits(rng.bf16_vec(static_cast<size_t>(T * hd), 0.5f)));
  DeviceBuffer q = DeviceBuffer::from(rng.bf16_vec(static_cast<size_t>(H * hd))), sink = DeviceBuffer::from(rng.f32_vec(static_cast<size_t>(H)));
  DeviceBuffer out(static_cast<size_t>(H * hd) * 4);
  const std::vector<const uint16_t*> pa = {ring.as<uint16_t>()}, pb = {comp.as<uint16_t>()};
  DeviceBuffer dpa = DeviceBuffer::from(pa), dpb = DeviceBuffer::from(pb);
  const int64_t p = 2 * T + 5;  // ratio 1: every entry visible

  auto step = [&](cudaStream_t st) {
    gpu::RmsNormArgs rn{x.as<float>(), dim, nw.as<float>(), xn.as<float>(), dim, 1, dim, static_cast<float>(c.rms_norm_eps)};
    gpu::rms_norm(rn, st);
    gpu::ActQuantArgs aq{xn.as<float>(), 1, dim, dim, codes.as<uint8_t>(), scales.as<float>()};
    gpu::act_quant8(aq, st);
    gpu::Lin8Args l8;
    l8.w = {w8.as<uint8_t>(), w8s.as<uint8_t>(), dim, qlr};
    l8.x_codes = codes.as<uint8_t>();
    l8.x_scales = scales.as<float>();
    l8.m = 1;
    l8.y = y.as<float>();
    l8.y_stride = qlr;
    gpu::lin8(l8, st);
    gpu::RouterArgs ra;
    ra.x = xn.as<float>();
    ra.n = 1;
    ra.dim = dim;
    ra.gate_w = gw.as<float>();
    ra.gate_bias = gb.as<float>();
    ra.n_experts = E;
    ra.top_k = K;
    ra.route_scale = static_cast<float>(c.routed_scaling_factor);
    ra.ids = ids.as<int32_t>();
    ra.weights = wts.as<float>();
    ra.scratch = rscratch.as<float>();
    gpu::router(ra, st);
    gpu::IndexerArgs ia;
    ia.qi = qi.as<float>();
    ia.w = iw.as<float>();
    ia.keys = dkeys.as<uint16_t>();
    ia.n_keys = T;
    ia.n = 1;
    ia.heads = IH;
    ia.head_dim = ID;
    ia.T = T;
    ia.start = p;
    ia.ratio = 1;
    ia.scores = scores.as<float>();
    gpu::indexer_scores(ia, st);
    gpu::TopkArgs ta;
    ta.values = scores.as<float>();
    ta.rows = 1;
    ta.n = T;
    ta.stride = T;
    ta.k = tk;
    ta.pos0 = p;
    ta.ratio = 1;
    ta.out = sel.as<int32_t>();
    gpu::topk_sorted(ta, st);
    gpu::AttnListArgs la;
    la.list = list.as<int32_t>();
    la.n = 1;
    la.win = win;
    la.win_len = win;
    la.decode = true;
    la.start = p;
    la.split = win;
    la.topk = sel.as<int32_t>();
    la.topk_len = tk;
    la.n_entries = T;
    gpu::attn_lists(la, st);
    gpu::SparseAttnArgs sa;
    sa.q = q.as<float>();
    sa.list = list.as<int32_t>();
    sa.list_len = win + tk;
    sa.pool_a = dpa.as<const uint16_t*>();
    sa.pool_b = dpb.as<const uint16_t*>();
    sa.split = win;
    sa.sink = sink.as<float>();
    sa.scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
    sa.n_q = 1;
    sa.heads = H;
    sa.d = hd;
    sa.out = out.as<float>();
    gpu::sparse_attention_decode(sa, st);
  };
  auto snapshot = [&] {
    std::vector<float> v = y.to_host<float>(static_cast<size_t>(qlr));
    std::vector<float> o = out.to_host<float>(static_cast<size_t>(H * hd));
    std::vector<float> w = wts.to_host<float>(static_cast<size_t>(K));
    v.insert(v.end(), o.begin(), o.end());
    v.insert(v.end(), w.begin(), w.end());
    for (int32_t i : ids.to_host<int32_t>(static_cast<size_t>(K))) v.push_back(static_cast<float>(i));
    for (int32_t i : sel.to_host<int32_t>(static_cast<size_t>(tk))) v.push_back(static_cast<float>(i));
    return v;
  };
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  step(st);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  const std::vector<float> eager = snapshot();
  ASSERT_EQ(cudaMemsetAsync(out.get(), 0xFF, out.bytes(), st), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(y.get(), 0xFF, y.bytes(), st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
  step(st);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  expect_equal("graph replay vs eager", snapshot(), eager);
  const double us = time_us([&] { cudaGraphLaunch(exec, st); cudaStreamSynchronize(st); });
  report_time("decode-shaped graph (" + std::to_string(nodes) + " kernels)", us);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace dsv41::test
