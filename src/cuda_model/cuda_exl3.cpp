// EXL3 checkpoints on the CUDA backend: EXL3 linears (attention projections, wo_a slices, the
// compressor, indexer wq_b, shared experts, head) run through the EXL3 GEMM of dsv41/ops/exl3_gpu.h,
// routed experts through the grouped MoE kernels. The tensors are read and validated by the CPU
// engine's own loader (exl3::load_exl3_linear), so both engines accept exactly the same checkpoints.
//
// Numerics against the CPU engine (src/model/linears.cpp + src/exl3/): the decoded weights are
// bit-identical (the kernels' decoder matches EXL3.md §2.6), but the kernels stage the Hadamard-
// rotated input as fp16 (f16 and large paths) or as two int8 levels (int8 path, MUL1, m <= 4, with
// the affine MUL1 codebook) and accumulate in another order than the CPU's fp32 Hadamard
// formulation: a linear's outputs differ by about 2e-4 of their scale, so some bf16 roundings
// downstream flip by one ulp (tolerances: tests/gpu_model/exl3_parity_test.cpp). The kernel path
// follows the row count (int8 / f16 up to 8 rows, large beyond), so unlike the FP8/FP4 path the
// results are not bit-identical across pass and chunk sizes. The MoE keeps the CPU engine's routing (the router op), rounding points
// (MoeParams::bf16_points: g, u, weighted activation, each expert's output, the sum) and order of
// sums (experts in increasing id, shared expert last).
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/exl3/exl3_linear.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

namespace {

// Vectors the CPU loader widened to fp32, back to the fp16 the kernels read. Stored suh/svh/bias
// are F16 (legacy sign words give ±1), so this is exact; anything else is refused.
std::vector<uint16_t> to_f16_exact(const std::vector<float>& v, const std::string& what) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    h[i] = f32_to_f16_bits(v[i]);
    DSV_CHECK(f16_bits_to_f32(h[i]) == v[i],
              "{}[{}] = {} is not an fp16 value (the CUDA EXL3 kernels read fp16 scales and biases)", what, i, v[i]);
  }
  return h;
}

int codebook_id(exl3::Codebook c) {
  switch (c) {
    case exl3::Codebook::k3Inst: return 0;
    case exl3::Codebook::kMcg: return 1;
    case exl3::Codebook::kMul1: return 2;
  }
  return 2;
}

// Tokens per grouped-MoE call: the kernels take m <= 8 tokens and m * top_k <= 128 selections.
int64_t moe_tokens_per_call(int64_t top_k) { return std::min<int64_t>(8, 128 / top_k); }

}  // namespace

GpuLinear Impl::upload_exl3(const std::string& prefix, int64_t in, int64_t out, int64_t row_begin, int64_t row_end) {
  const std::unique_ptr<Linear> cpu = exl3::load_exl3_linear(*ckpt, prefix, in, out);
  const auto* lin = dynamic_cast<const exl3::Exl3Linear*>(cpu.get());
  DSV_ASSERT(lin != nullptr, "{}: the EXL3 loader returned another linear type", prefix);
  const exl3::Exl3Tensors& t = lin->storage();
  if (row_end < 0) row_end = out;
  // Tensor parallelism: outputs [row_begin, row_end) only. The trellis is [k/16][n/16][16K] words
  // and the output Hadamard works on aligned 128-column blocks (EXL3.md §2, §3), so a slice of
  // whole 128-column blocks is the tiles of those columns with their svh and bias: the same linear
  // for those outputs, bit for bit. The last slice runs to the padded end.
  DSV_CHECK(row_begin >= 0 && row_begin < row_end && row_end <= out && row_begin % 128 == 0 &&
                (row_end % 128 == 0 || row_end == out),
            "{}: tensor parallelism splits an EXL3 linear at multiples of 128 outputs; this rank's share is [{}, {}) "
            "of {}: use fewer ranks",
            prefix, row_begin, row_end, out);
  const int64_t n0 = row_begin, n1 = row_end == out ? t.n : row_end, tn = t.n / 16, words = 16 * t.K;
  const int64_t cols = n1 - n0;
  GpuLinear l;
  l.kind = GpuLinear::Kind::Exl3;
  l.in = in;
  l.out = row_end - row_begin;
  const uint64_t bytes = static_cast<uint64_t>(t.k) * static_cast<uint64_t>(cols) * t.K / 8;
  l.w = DeviceBuffer(static_cast<size_t>(bytes));
  if (cols == t.n) {
    l.w.upload(t.trellis, static_cast<size_t>(bytes));
  } else {
    std::vector<uint16_t> part(static_cast<size_t>(bytes / 2));
    const int64_t run = cols / 16 * words;  // one row of tiles of the slice
    for (int64_t tk = 0; tk < t.k / 16; ++tk)
      std::copy_n(t.trellis + (tk * tn + n0 / 16) * words, run, part.data() + tk * run);
    l.w.upload(part.data(), static_cast<size_t>(bytes));
  }
  // s = suh [k] | svh [n] | bias [n] (fp16)
  std::vector<uint16_t> s = to_f16_exact(t.suh, prefix + ".suh");
  const std::vector<uint16_t> svh = to_f16_exact(t.svh, prefix + ".svh");
  s.insert(s.end(), svh.begin() + n0, svh.begin() + n1);
  if (!t.bias.empty()) {
    const std::vector<uint16_t> bias = to_f16_exact(t.bias, prefix + ".bias");
    s.insert(s.end(), bias.begin() + n0, bias.begin() + n1);
  }
  l.s = DeviceBuffer::from(s);
  const uint16_t* sp = l.s.as<uint16_t>();
  l.exl3.trellis = l.w.as<uint16_t>();
  l.exl3.suh = sp;
  l.exl3.svh = sp + t.k;
  l.exl3.bias = t.bias.empty() ? nullptr : sp + t.k + cols;
  l.exl3.k = static_cast<int32_t>(t.k);
  l.exl3.n = static_cast<int32_t>(cols);
  l.exl3.bits = t.K;
  l.exl3.codebook = codebook_id(t.codebook);
  // Any row count up to the pass size may reach this linear (the head: a pass's logit rows). The
  // plan, and with it the workspace, depends on the shape and the row count only: size each
  // distinct shape once over every row count.
  const std::array<int32_t, 4> shape{l.exl3.k, l.exl3.n, l.exl3.bits, l.exl3.codebook};
  if (std::find(exl3_shapes.begin(), exl3_shapes.end(), shape) == exl3_shapes.end()) {
    exl3_shapes.push_back(shape);
    const int64_t most = std::min(std::max<int64_t>(1, opts.max_chunk_tokens), ops::exl3_gemm_max_rows(l.exl3));
    for (int64_t m = 1; m <= most; ++m)
      exl3_ws_bytes = std::max(exl3_ws_bytes, ops::exl3_gemm_plan(l.exl3, m).workspace);
  }
  weight_bytes += static_cast<int64_t>(l.w.bytes() + l.s.bytes());
  count_weight_bytes(l);
  return l;
}

// The uniform kinds of a layer's expert tables (GpuExl3Experts) in the MoE call's parameters.
static void set_moe_kinds(ops::MoeParams& p, const GpuExl3Experts& x) {
  p.gate_up_bits = x.gate_up_bits;
  p.gate_up_codebook = x.gate_up_codebook;
  p.down_bits = x.down_bits;
  p.down_codebook = x.down_codebook;
}

void Impl::load_exl3_experts(GpuBlock& b, const std::string& fp, int64_t expert_end) {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, inter = c.moe_intermediate_size, E = b.n_experts;
  DSV_CHECK(b.top_k >= 1 && b.top_k <= 128, "{}: {} experts per token; the CUDA EXL3 MoE takes 1..128", fp, b.top_k);
  DSV_CHECK(E >= 1 && E <= 1023, "{}: {} routed experts; the CUDA EXL3 MoE takes 1..1023", fp, E);
  for (const GpuLinear* s : {&b.sh_w1, &b.sh_w2, &b.sh_w3})
    DSV_CHECK(s->kind == GpuLinear::Kind::Exl3,
              "{}.shared_experts: the routed experts are EXL3, so the CUDA backend needs an EXL3 shared expert too "
              "(it runs in the same grouped MoE call)",
              fp);
  GpuExl3Experts& x = b.x_experts;
  std::vector<ops::Exl3Matrix> gate, up, down;
  for (int64_t e = b.expert_begin; e < expert_end; ++e) {
    const std::string p = fp + ".experts." + std::to_string(e);
    for (const char* w : {".w1", ".w2", ".w3"})
      DSV_CHECK(exl3::is_exl3_linear(*ckpt, p + w),
                "{}{}: expert 0 of this layer is EXL3, so every routed expert must be (the CUDA MoE runs one format "
                "per layer)",
                p, w);
    x.w1.push_back(upload_exl3(p + ".w1", dim, inter));
    x.w2.push_back(upload_exl3(p + ".w2", inter, dim));
    x.w3.push_back(upload_exl3(p + ".w3", dim, inter));
    gate.push_back(x.w1.back().exl3);
    down.push_back(x.w2.back().exl3);
    up.push_back(x.w3.back().exl3);
  }
  // A split layer's grouped tables hold this rank's experts only: its shared expert runs apart, in
  // column slices (moe_exl3); its large passes run expert by expert.
  const bool shared_in = !b.split;
  DSV_CHECK(shared_in || c.quant.method == "exl3",
            "{}: tensor parallelism runs an EXL3 layer's large passes expert by expert, which needs quantization "
            "method exl3 in the config",
            fp);
  if (shared_in) {
    gate.push_back(b.sh_w1.exl3);
    down.push_back(b.sh_w2.exl3);
    up.push_back(b.sh_w3.exl3);
  }
  x.hidden = gate.front().k;
  x.inter = gate.front().n;
  for (const auto* table : {&gate, &up, &down})
    for (const ops::Exl3Matrix& m : *table) x.max_bits = std::max(x.max_bits, static_cast<int>(m.bits));
  // One kind per projection lets the decode MoE take the stream path (exl3_moe.h).
  auto uniform = [](std::initializer_list<const std::vector<ops::Exl3Matrix>*> tables, int& bits, int& codebook) {
    const ops::Exl3Matrix& first = tables.begin()[0]->front();
    bits = first.bits;
    codebook = first.codebook;
    for (const auto* table : tables)
      for (const ops::Exl3Matrix& m : *table)
        if (m.bits != first.bits || m.codebook != first.codebook) bits = 0;
  };
  uniform({&gate, &up}, x.gate_up_bits, x.gate_up_codebook);
  uniform({&down}, x.down_bits, x.down_codebook);
  x.gate = DeviceBuffer::from(gate);
  x.up = DeviceBuffer::from(up);
  x.down = DeviceBuffer::from(down);

  // Workspace for the largest call (m tokens per call; the layout grows with m).
  ops::MoeParams p;
  p.gate = x.gate.as<ops::Exl3Matrix>();
  p.up = x.up.as<ops::Exl3Matrix>();
  p.down = x.down.as<ops::Exl3Matrix>();
  p.n_experts = static_cast<int>(shared_in ? E : expert_end - b.expert_begin);
  p.has_shared = shared_in;
  p.hidden = x.hidden;
  p.inter = x.inter;
  p.max_bits = x.max_bits;
  set_moe_kinds(p, x);
  p.x = p.y = x.gate.get();  // planning checks only that pointers are set; sizes decide the workspace
  p.topk_ids = x.gate.as<int32_t>();
  p.topk_weights = x.gate.as<float>();
  p.topk = static_cast<int>(b.top_k);
  p.x_cols = p.x_stride = p.y_cols = p.y_stride = dim;
  const int64_t most = std::min(moe_tokens_per_call(b.top_k), std::max<int64_t>(1, opts.max_chunk_tokens));
  for (int64_t m = 1; m <= most; ++m) {
    p.m = static_cast<int>(m);
    exl3_moe_ws_bytes = std::max(exl3_moe_ws_bytes, ops::exl3_moe_workspace_bytes(p));
  }
}

void Impl::alloc_exl3_workspaces() {
  if (exl3_ws_bytes > 0) {
    exl3_ws = DeviceBuffer(exl3_ws_bytes);
    ops::exl3_workspace_init(exl3_ws.get(), exl3_ws.bytes(), stream);
  }
  if (exl3_moe_ws_bytes > 0) {
    exl3_moe_ws = DeviceBuffer(exl3_moe_ws_bytes);
    ops::exl3_workspace_init(exl3_moe_ws.get(), exl3_moe_ws.bytes(), stream);
  }
  gpu::check_cuda(cudaStreamSynchronize(stream), "EXL3 workspace init");
}

// y = x·W on the EXL3 GEMM: fp32 activations in, fp32 sums out (padded inputs read as zeros, padded
// outputs trimmed by the kernel), rounded to bf16 values in the kernel's epilogue where asked. Rows
// beyond one call's reach (ops::exl3_gemm_max_rows: ~1,024 for the head) go in several calls.
void Impl::linear_exl3(const GpuLinear& l, const float* x, int64_t x_stride, int64_t m, float* y, int64_t y_stride,
                       bool round) {
  ops::GemmParams p;
  p.w = l.exl3;
  p.x_type = ops::ActType::F32;
  p.x_cols = l.in;
  p.x_stride = x_stride;
  p.y_type = ops::ActType::F32;
  p.y_cols = l.out;
  p.y_stride = y_stride;
  p.workspace = exl3_ws.get();
  p.workspace_bytes = exl3_ws.bytes();
  p.round_bf16 = round;
  const int64_t most = ops::exl3_gemm_max_rows(l.exl3);
  for (int64_t r0 = 0; r0 < m; r0 += most) {
    p.m = std::min(most, m - r0);
    p.x = x + r0 * x_stride;
    p.y = y + r0 * y_stride;
    ops::exl3_gemm(p, stream);
  }
}

// The wo_a slices of a layer (one EXL3 linear per output group, EXL3.md §1.8) are small: at decode
// each is a short call whose cost is mostly fixed (two launches, the pipeline's fill, the last
// group's reduction). When they share shape, bit width and codebook they run as one batched call
// of the small paths (GemmParams::batch): one staging and one stream launch for all groups.
void Impl::plan_wo_a_batch(GpuBlock& b) {
  std::vector<ops::Exl3Matrix> ws;
  for (const GpuLinear& l : b.wo_a_slices) {
    if (l.kind != GpuLinear::Kind::Exl3) return;
    const ops::Exl3Matrix& f = b.wo_a_slices.front().exl3;
    if (l.exl3.k != f.k || l.exl3.n != f.n || l.exl3.bits != f.bits || l.exl3.codebook != f.codebook) return;
    ws.push_back(l.exl3);
  }
  if (ws.size() < 2) return;
  b.wo_a_batch = DeviceBuffer::from(ws);
  const auto batch = static_cast<int>(ws.size());
  for (int64_t m = 1; m <= std::min<int64_t>(8, std::max<int64_t>(1, opts.max_chunk_tokens)); ++m) {
    const ops::GemmPlan plan = ops::exl3_gemm_plan(ws.front(), m, ops::GemmPath::Auto, 0, batch);
    exl3_ws_bytes = std::max(exl3_ws_bytes, plan.workspace);
  }
}

bool Impl::wo_a_batched(const GpuBlock& b, const float* x, int64_t x_stride, int64_t x_step, int64_t m, float* y,
                        int64_t y_stride, int64_t y_step) {
  if (b.wo_a_batch.bytes() == 0 || m > 8) return false;
  const GpuLinear& l = b.wo_a_slices.front();
  ops::GemmParams p;
  p.w = l.exl3;
  p.batch = static_cast<int>(b.wo_a_slices.size());
  p.batch_w = b.wo_a_batch.as<ops::Exl3Matrix>();
  p.x = x;
  p.x_type = ops::ActType::F32;
  p.m = m;
  p.x_cols = l.in;
  p.x_stride = x_stride;
  p.x_batch_stride = x_step;
  p.y = y;
  p.y_type = ops::ActType::F32;
  p.y_cols = l.out;
  p.y_stride = y_stride;
  p.y_batch_stride = y_step;
  p.round_bf16 = true;
  p.workspace = exl3_ws.get();
  p.workspace_bytes = exl3_ws.bytes();
  ops::exl3_gemm(p, stream);
  return true;
}

// The MoE of an EXL3 layer after the router (block.cpp moe): the selected experts and the shared
// expert in one grouped call per (up to) 8 tokens, written to sc.y as bf16 values.
void Impl::moe_exl3(const GpuBlock& b, int64_t n) {
  // Large passes run expert by expert. That form waits for the router's ids on the host, which a
  // step being captured into a CUDA graph cannot.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  gpu::check_cuda(cudaStreamIsCapturing(stream, &capturing), "EXL3 MoE: capture status");
  if (opts.exl3_by_expert_min_tokens > 0 && n >= opts.exl3_by_expert_min_tokens && sc.exl3_rows &&
      capturing == cudaStreamCaptureStatusNone) {
    moe_exl3_by_expert(b, n);
    return;
  }
  const GpuExl3Experts& x = b.x_experts;
  const int64_t dim = cfg.hidden_size, K = b.top_k, per = moe_tokens_per_call(K), pairs = n * K;
  // A split layer (tensor parallelism): the grouped kernels over this rank's experts only (other
  // ranks' pairs get id -1, skipped) give each token's partial sum, rounded to bf16 as the kernels
  // round their sum; the ranks all-reduce the partials with the shared expert's slices and add them
  // (a combine of one slot per token). That is two more roundings than one GPU's single sum, within
  // the EXL3 tolerances (tests/gpu2_tp/cuda_tp_exl3_test.cpp).
  const int32_t* ids = sc.ids;
  float* y = sc.y;
  const MoeRows mr = moe_rows(b, n);
  float* part = b.split ? mr.shared - n * dim : nullptr;  // right before the shared rows: one all-reduce
  if (b.split) {
    ids = tp_local_expert_ids(b, pairs, static_cast<int64_t>(x.w1.size()));
    y = part;
    tp_zero(part, n * dim);  // a token none of whose experts is here keeps zeros
  }
  ops::MoeParams p;
  p.gate = x.gate.as<ops::Exl3Matrix>();
  p.up = x.up.as<ops::Exl3Matrix>();
  p.down = x.down.as<ops::Exl3Matrix>();
  p.n_experts = static_cast<int>(b.split ? static_cast<int64_t>(x.w1.size()) : b.n_experts);
  p.has_shared = !b.split;
  p.hidden = x.hidden;
  p.inter = x.inter;
  p.max_bits = x.max_bits;
  set_moe_kinds(p, x);
  p.swiglu_limit = static_cast<float>(cfg.swiglu_limit);
  p.bf16_points = true;
  p.x_type = ops::ActType::F32;
  p.x_cols = p.x_stride = dim;
  p.topk = static_cast<int>(K);
  p.y_type = ops::ActType::F32;
  p.y_cols = p.y_stride = dim;
  p.workspace = exl3_moe_ws.get();
  p.workspace_bytes = exl3_moe_ws.bytes();
  for (int64_t t0 = 0; t0 < n; t0 += per) {
    p.m = static_cast<int>(std::min(per, n - t0));
    p.x = sc.x + t0 * dim;
    p.topk_ids = ids + t0 * K;
    p.topk_weights = sc.route_w + t0 * K;
    p.y = y + t0 * dim;
    ops::exl3_moe(p, stream);
    ++path_stats.exl3_moe_grouped_calls;
  }
  if (b.split) {
    shared_expert_exl3(b, n, mr);
    tp_sum(part, 2 * n * dim);  // the partials and mr.shared after them
    gpu::moe_combine({part, tp_zero_ids.as<int32_t>(), n, 1, dim, mr.shared, sc.y}, stream);
  }
}

void Impl::shared_expert_exl3(const GpuBlock& b, int64_t n, const MoeRows& mr) {
  const int64_t dim = cfg.hidden_size, inter = cfg.moe_intermediate_size;
  if (b.split) tp_zero(mr.sg, 2 * n * inter);
  linear_exl3(b.sh_w1, sc.x, dim, n, mr.sg + b.sh_inter_begin, inter, true);
  linear_exl3(b.sh_w3, sc.x, dim, n, mr.su + b.sh_inter_begin, inter, true);
  if (b.split) tp_sum(mr.sg, 2 * n * inter);
  gpu::swiglu({mr.sg, mr.su, n, inter, nullptr, static_cast<float>(cfg.swiglu_limit), mr.sg}, stream);
  if (b.split) tp_zero(mr.shared, n * dim);
  linear_exl3(b.sh_w2, mr.sg, inter, n, mr.shared + b.sh_dim_begin, dim, true);
}

// The MoE of an EXL3 layer for a large pass, in the CPU engine's own form (block.cpp moe): each
// routed expert's three linears run over all the rows that picked it, so a pass reads each expert
// with tokens once (the grouped decode kernels read every expert a call's 8 tokens picked, per
// call: 256 calls of a 2048-token pass). The pairs are bucketed by expert on the host — one
// download of the router's ids and weights per layer, since the per-expert row counts shape the
// launches — in pair order within an expert (the CPU engine's token order). The experts' linears
// then run as grouped GEMMs (kernels/exl3/exl3_grouped.h): the gathered, transformed inputs of
// every sorted row, then one launch per projection and (bits, codebook, row class), each block one
// expert's (up to) 64 rows x 128 columns over the whole k. Rounding points and sums are the grouped
// decode kernels': g, u, the weighted activation, each expert's output and the sum to bf16 values,
// a token's experts added in increasing id, the shared expert last (moe_combine).
//
// Tensor parallelism (cuda_tp.cpp): a rank runs its experts [expert_begin, +w1.size()) and leaves
// zero rows for the other ranks' pairs, its shared expert's column slices write into zeroed rows,
// and the ranks all-reduce them as the FP8/FP4 MoE does (cuda_moe.cpp).
void Impl::moe_exl3_by_expert(const GpuBlock& b, int64_t n) {
  const GpuExl3Experts& x = b.x_experts;
  const int64_t dim = cfg.hidden_size, inter = cfg.moe_intermediate_size, K = b.top_k, E = b.n_experts;
  const int64_t pairs = n * K, e0 = b.expert_begin, e1 = e0 + static_cast<int64_t>(x.w1.size());
  const model::Exl3SortLayout layout = model::exl3_sort_layout(pairs, dim, inter, E);
  DSV_ASSERT(sc.exl3_rows != nullptr && n <= sc.m, "EXL3 MoE by expert: {} tokens (scratch of {})", n, sc.m);
  std::vector<int32_t> ids(static_cast<size_t>(pairs));
  std::vector<float> w(static_cast<size_t>(pairs));
  gpu::check_cuda(cudaMemcpyAsync(ids.data(), sc.ids, ids.size() * 4, cudaMemcpyDeviceToHost, stream),
                  "MoE ids download");
  gpu::check_cuda(cudaMemcpyAsync(w.data(), sc.route_w, w.size() * 4, cudaMemcpyDeviceToHost, stream),
                  "MoE weights download");
  sync_stream("EXL3 MoE routing");
  // start[e - e0]: the first sorted row of local expert e; pairs of other ranks' experts get no row.
  std::vector<int64_t> start(static_cast<size_t>(e1 - e0 + 1), 0);
  for (int32_t e : ids) {
    DSV_CHECK(e >= 0 && e < E, "EXL3 MoE: router picked expert {} of {}", e, E);
    if (e >= e0 && e < e1) ++start[static_cast<size_t>(e - e0) + 1];
  }
  for (int64_t e = 0; e < e1 - e0; ++e) start[static_cast<size_t>(e + 1)] += start[static_cast<size_t>(e)];
  const int64_t local = start.back();
  // The index, uploaded after the inputs' area of the scratch piece: per sorted row its token,
  // routing weight, pair and local expert; then the tiles, launch by launch.
  std::vector<int32_t> index(static_cast<size_t>(4 * pairs));
  int32_t* token_of = index.data();
  float* weight_of = reinterpret_cast<float*>(index.data() + pairs);
  int32_t* pair_of = index.data() + 2 * pairs;
  int32_t* expert_of = index.data() + 3 * pairs;
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t e = ids[static_cast<size_t>(p)];
    if (e < e0 || e >= e1) continue;
    const int64_t r = fill[static_cast<size_t>(e - e0)]++;
    token_of[r] = static_cast<int32_t>(p / K);
    weight_of[r] = w[static_cast<size_t>(p)];
    pair_of[r] = static_cast<int32_t>(p);
    expert_of[r] = static_cast<int32_t>(e - e0);
  }
  // Tiles by launch: (projection, bits, codebook, row class), each expert's rows in 64-row tiles
  // (the last one shorter), in expert order within a launch.
  struct Launch {
    bool down;
    int bits, codebook, row_class;
    std::vector<ops::GroupedTile> tiles;
  };
  std::vector<Launch> launches;
  for (const bool down : {false, true}) {
    const size_t first = launches.size();
    for (size_t e = 0; e < x.w1.size(); ++e) {
      const int64_t r0 = start[e], cnt = start[e + 1] - r0;
      for (int64_t r = 0; r < cnt; r += exl3::cuda::kLargeRows)
        for (int set = 0; set < (down ? 1 : 2); ++set) {
          const ops::Exl3Matrix& m = (down ? x.w2 : set == 0 ? x.w1 : x.w3)[e].exl3;
          const auto rows = static_cast<int32_t>(std::min<int64_t>(exl3::cuda::kLargeRows, cnt - r));
          const int rc = ops::grouped_row_class(rows);
          auto same = [&](const Launch& q) {
            return q.bits == m.bits && q.codebook == m.codebook && q.row_class == rc;
          };
          auto l = std::find_if(launches.begin() + static_cast<std::ptrdiff_t>(first), launches.end(), same);
          if (l == launches.end()) l = launches.insert(launches.end(), Launch{down, m.bits, m.codebook, rc, {}});
          l->tiles.push_back({set, static_cast<int32_t>(e), static_cast<int32_t>(r0 + r), rows});
        }
    }
  }
  std::vector<ops::GroupedTile> tiles;
  std::vector<size_t> tile_first;
  for (const Launch& l : launches) {
    tile_first.push_back(tiles.size());
    tiles.insert(tiles.end(), l.tiles.begin(), l.tiles.end());
  }
  DSV_ASSERT(static_cast<int64_t>(tiles.size()) <= layout.max_tiles, "EXL3 MoE: {} tiles, planned for {}",
             tiles.size(), layout.max_tiles);
  auto* dev_index = reinterpret_cast<int32_t*>(reinterpret_cast<unsigned char*>(sc.exl3_rows) + layout.xh_bytes);
  auto* dev_tiles = reinterpret_cast<ops::GroupedTile*>(dev_index + 4 * pairs);
  gpu::check_cuda(cudaMemcpyAsync(dev_index, index.data(), index.size() * 4, cudaMemcpyHostToDevice, stream),
                  "MoE index upload");
  gpu::check_cuda(cudaMemcpyAsync(dev_tiles, tiles.data(), tiles.size() * sizeof(ops::GroupedTile),
                                  cudaMemcpyHostToDevice, stream),
                  "MoE tiles upload");
  const int32_t* d_token = dev_index;
  const float* d_weight = reinterpret_cast<const float*>(dev_index + pairs);
  const int32_t* d_pair = dev_index + 2 * pairs;
  const int32_t* d_expert = dev_index + 3 * pairs;

  // Inputs: gate and up x_had side by side in the piece; the down projection's after them reuse it.
  auto* xh = reinterpret_cast<__half*>(sc.exl3_rows);
  ops::GroupedInputParams in;
  in.x = sc.x;
  in.x_type = ops::ActType::F32;
  in.x_stride = in.x_cols = dim;
  in.src_row = d_token;
  in.matrix_of = d_expert;
  in.mats[0] = x.gate.as<ops::Exl3Matrix>();
  in.mats[1] = x.up.as<ops::Exl3Matrix>();
  in.sets = 2;
  in.k = x.hidden;
  in.rows = local;
  in.xh[0] = xh;
  in.xh[1] = xh + local * x.hidden;
  ops::exl3_grouped_input(in, stream);
  auto run = [&](bool down, const ops::GroupedGemmParams& base) {
    for (size_t i = 0; i < launches.size(); ++i) {
      const Launch& l = launches[i];
      if (l.down != down) continue;
      ops::GroupedGemmParams g = base;
      g.tiles = dev_tiles + tile_first[i];
      g.ntiles = static_cast<int>(l.tiles.size());
      g.bits = l.bits;
      g.codebook = l.codebook;
      g.row_class = l.row_class;
      ops::exl3_grouped_gemm(g, stream);
    }
  };
  ops::GroupedGemmParams gu;
  gu.mats[0] = in.mats[0];
  gu.mats[1] = in.mats[1];
  gu.k = x.hidden;
  gu.n = x.inter;
  gu.xh[0] = in.xh[0];
  gu.xh[1] = in.xh[1];
  gu.y[0] = sc.eg;
  gu.y[1] = sc.eu;
  gu.y_stride = gu.y_cols = inter;
  gu.round_bf16 = true;
  run(false, gu);
  const float limit = static_cast<float>(cfg.swiglu_limit);
  gpu::swiglu({sc.eg, sc.eu, local, inter, d_weight, limit, sc.eg}, stream);

  ops::GroupedInputParams din;
  din.x = sc.eg;
  din.x_type = ops::ActType::F32;
  din.x_stride = din.x_cols = inter;
  din.matrix_of = d_expert;
  din.mats[0] = x.down.as<ops::Exl3Matrix>();
  din.sets = 1;
  din.k = x.inter;
  din.rows = local;
  din.xh[0] = xh;
  ops::exl3_grouped_input(din, stream);
  // Down: each sorted row straight to its pair's row; other ranks' pairs keep zero rows.
  if (local < pairs) tp_zero(sc.routed, pairs * dim);
  ops::GroupedGemmParams dn;
  dn.mats[0] = din.mats[0];
  dn.k = x.inter;
  dn.n = x.hidden;
  dn.xh[0] = xh;
  dn.y[0] = sc.routed;
  dn.y_stride = dn.y_cols = dim;
  dn.out_row = d_pair;
  dn.round_bf16 = true;
  run(true, dn);

  const MoeRows mr = moe_rows(b, n);
  shared_expert_exl3(b, n, mr);
  if (b.split) tp_sum(sc.routed, (pairs + n) * dim);  // the routed rows and mr.shared after them
  gpu::moe_combine({sc.routed, sc.ids, n, K, dim, mr.shared, sc.y}, stream);
  ++path_stats.exl3_moe_by_expert;
}

}  // namespace dsv41::model::cuda
#endif
