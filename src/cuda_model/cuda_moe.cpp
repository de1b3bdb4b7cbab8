// The CUDA backend's MoE layer (mirrors block.cpp moe/run_expert): router, routed experts over the
// (token, slot) pairs, shared expert, combine. EXL3 experts go through cuda_exl3.cpp.
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include "dsv41/common/error.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

// MoE (block.cpp moe/run_expert): router, routed experts as FP4 bank GEMMs over the (token, slot)
// pairs (per pair, or grouped by expert on the tensor cores for large passes), clamped SwiGLU
// scaled by the routing weight, shared expert, combine in expert order. The token codes (xq, or
// quantised here once) feed the routed gate/up banks and the shared expert's w1/w3; each SwiGLU
// writes the codes of its output for the down projection.
bool Impl::moe(const GpuBlock& b, int64_t n, bool exact, const QuantizedInput& xq, bool defer_combine) {
  const ModelConfig& c = cfg;
  const int64_t dim = c.hidden_size, K = b.top_k, inter = c.moe_intermediate_size, pairs = n * K;
  gpu::RouterArgs r =
      gpu::router_args(c, sc.x, n, b.gate_w.as<float>(), b.gate_bias.as<float>(), sc.ids, sc.route_w, sc.route_scratch);
  r.n_experts = b.n_experts;  // a DSpark stage's bank may differ from the target layers'
  r.top_k = K;
  gpu::router(r, stream);
  if (b.x_experts.loaded()) {  // EXL3: routed + shared experts in the grouped MoE kernels
    moe_exl3(b, n);
    return false;
  }

  // Tensor parallelism: this rank's bank holds experts [expert_begin, ..); other ranks' pairs get
  // id -1 (zero rows) and the routed rows are all-reduced (cuda_tp.cpp).
  const int32_t* bank_ids = b.split ? tp_local_expert_ids(b, pairs) : sc.ids;
  // sc.codes is the SwiGLU outputs' (the grouped path writes its activation codes there too): the
  // token codes live in sc.x_codes until the shared expert has read them.
  const QuantizedInput x_in = xq.empty() ? quantize(sc.x, dim, n, dim, sc.x_codes, sc.x_scales) : xq;
  DSV_ASSERT(x_in.k == dim && x_in.rows >= n, "moe: token codes of {} rows of {}", x_in.rows, x_in.k);
  auto lin4_args = [&](const GpuExpertBank& w, const QuantizedInput& in, int64_t div, float* y, int64_t out) {
    gpu::Lin4Args a;
    a.w = {w.packed.as<uint8_t>(), w.scales.as<uint8_t>(), w.in, w.out, w.n};
    a.x_codes = in.codes;
    a.x_scales = in.scales;
    a.rows = pairs;
    a.expert_ids = bank_ids;
    a.x_row_div = div;
    a.y = y;
    a.y_stride = out;
    a.round_bf16 = true;
    return a;
  };
  auto bank = [&](const GpuExpertBank& w, const QuantizedInput& in, int64_t div, float* y, int64_t out) {
    gpu::lin4(lin4_args(w, in, div, y, out), stream);
  };
  const float limit = static_cast<float>(c.swiglu_limit);
  // Large passes: the pairs bucketed by expert and the three projections as grouped tensor-core
  // GEMMs (not bit-identical, CudaModelOptions::grouped_moe_min_rows); otherwise the exact per-pair
  // Lin4 kernels.
  const bool grouped = !exact && !opts.exact_block_sums && opts.grouped_moe_min_rows > 0 && pairs >= opts.grouped_moe_min_rows &&
                       gpu::moe_grouped_supported(dim, inter);
  if (grouped) {
    gpu::MoeGroupedArgs g;
    auto weight = [](const GpuExpertBank& w) {
      return gpu::Fp4Weight{w.packed.as<uint8_t>(), w.scales.as<uint8_t>(), w.in, w.out, w.n};
    };
    g.w1 = weight(b.w1);
    g.w3 = weight(b.w3);
    g.w2 = weight(b.w2);
    g.x_codes = x_in.codes;
    g.x_scales = x_in.scales;
    g.n = n;
    g.top_k = K;
    g.expert_ids = bank_ids;
    g.route_w = sc.route_w;
    g.swiglu_limit = limit;
    g.act = sc.eg;
    g.act_codes = sc.codes;
    g.act_scales = sc.act_scales;
    g.sort = sc.moe_sort;
    g.sort_ints = sc.moe_sort_ints;
    g.y = sc.routed;
    // The scaled path's f16 rows in eu, which only the per-pair path below uses (sized m·K·inter
    // fp32 values; moe_grouped_rows16_bytes needs at most half of that plus the row exponents).
    const int64_t eu_bytes = sc.m * K * inter * 4;
    if (gpu::moe_grouped_rows16_bytes(n, K, dim, inter) <= eu_bytes) {
      g.rows16 = sc.eu;
      g.rows16_bytes = eu_bytes;
    }
    gpu::moe_grouped(g, stream);
  } else {
    // gate and up projections: one grouped launch (same codes, expert ids and width), bit-identical
    // to two bank() calls. Measured on H200 (bench_gpu_linear --pairs, real 2x2304x5120 banks):
    // 2 tokens 99.1 -> 83.2 us, 4 tokens 182.7 -> 149.5 us; one token 45.3 -> 49.9 us (slower; by the
    // launcher's grid rule the doubled tiles leave the spread one-wave grid for CTA tiles in about
    // 1.5 waves), so a single token keeps two launches. Above 64 pairs (row groups of four) it is not measured.
    const bool group_banks = n >= 2 && pairs <= 64;
    if (group_banks && b.w1.in == b.w3.in && b.w1.n == b.w3.n) {
      gpu::Lin4GroupArgs g;
      g.count = 2;
      g.lin[0] = lin4_args(b.w1, x_in, K, sc.eg, inter);
      g.lin[1] = lin4_args(b.w3, x_in, K, sc.eu, inter);
      gpu::lin4_group(g, stream);
    } else {
      bank(b.w1, x_in, K, sc.eg, inter);
      bank(b.w3, x_in, K, sc.eu, inter);
    }
    gpu::SwigluArgs s{sc.eg, sc.eu, pairs, inter, sc.route_w, limit, sc.eg, sc.codes, sc.act_scales};
    gpu::swiglu(s, stream);
    bank(b.w2, {sc.codes, sc.act_scales, pairs, inter}, 1, sc.routed, dim);
  }

  // Shared expert; split: column slices of w1/w3 and w2 written into zeroed buffers, all-reduced
  // (gate and up in one call; the output with the routed rows in one call, moe_rows).
  const MoeRows rows = moe_rows(b, n);
  if (b.split) tp_zero(rows.sg, 2 * n * inter);
  linear_pair(b.sh_w1, rows.sg + b.sh_inter_begin, inter, b.sh_w3, rows.su + b.sh_inter_begin, inter, sc.x, dim, n,
              true, x_in);
  if (b.split) tp_sum(rows.sg, 2 * n * inter);
  // The shared SwiGLU's codes go to sc.codes: the routed down projection has read them by now.
  gpu::SwigluArgs ss{rows.sg, rows.su, n, inter, nullptr, limit, rows.sg};
  QuantizedInput sg_in;
  if (takes_codes(b.sh_w2) && inter % 32 == 0) {
    ss.codes = sc.codes;
    ss.scales = sc.act_scales;
    sg_in = {sc.codes, sc.act_scales, n, inter};
  }
  gpu::swiglu(ss, stream);
  if (b.split) tp_zero(rows.shared, n * dim);
  linear(b.sh_w2, rows.sg, inter, n, rows.shared + b.sh_dim_begin, dim, true, sg_in);
  if (b.split) tp_sum(sc.routed, (pairs + n) * dim);  // the routed rows and rows.shared after them
  if (defer_combine) return true;  // sc.routed, sc.ids and moe_rows().shared feed the caller's fused expand
  gpu::MoeCombineArgs mc{sc.routed, sc.ids, n, K, dim, rows.shared, sc.y};
  gpu::moe_combine(mc, stream);
  return false;
}

}  // namespace dsv41::model::cuda
#endif
