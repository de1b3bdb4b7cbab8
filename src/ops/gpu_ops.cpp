// Argument validation for the non-EXL3 CUDA ops: everything a caller can get wrong is checked
// here (shapes, pointers, alignment, kernel limits), so the raw launchers can trust their input.
#include "dsv41/ops/gpu_ops.h"

#if DSV41_HAS_CUDA
#include <cstdint>
#include <cstdlib>

#include "dsv41/common/error.h"
#include "dsv41/model/mix_gemm_parts.h"
#include "dsv41/ops/gpu_buffer.h"
#include "ops/gpu_norm_checks.h"

namespace dsv41::ops::gpu {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void launched(cudaError_t e, const char* what) { check_cuda(e, what); }

// DSV41_NO_LIN_GROUP=1 runs grouped linears as separate launches (same results; for measuring
// what one launch brings).
bool lin_groups_enabled() {
  static const bool on = std::getenv("DSV41_NO_LIN_GROUP") == nullptr;
  return on;
}

}  // namespace

HcMixArgs hc_mix_args(const ModelConfig& c, const float* h, int64_t n, const float* fn, const float* base,
                      const float* scale, float* mix) {
  HcMixArgs a;
  a.h = h;
  a.n = n;
  a.hc = c.hc_mult;
  a.dim = c.hidden_size;
  a.fn = fn;
  a.base = base;
  a.scale = scale;
  a.iters = c.hc_sinkhorn_iters;
  a.hc_eps = static_cast<float>(c.hc_eps);
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  a.mix = mix;
  return a;
}

RouterArgs router_args(const ModelConfig& c, const float* x, int64_t n, const float* gate_w, const float* gate_bias,
                       int32_t* ids, float* weights, float* scratch) {
  RouterArgs a;
  a.x = x;
  a.n = n;
  a.dim = c.hidden_size;
  a.gate_w = gate_w;
  a.gate_bias = gate_bias;
  a.n_experts = c.n_routed_experts;
  a.top_k = c.num_experts_per_tok;
  a.scoring = c.scoring_func == "sigmoid" ? Scoring::Sigmoid : Scoring::SqrtSoftplus;
  a.temp = static_cast<float>(c.gate_temp);
  a.norm_topk = c.norm_topk_prob;
  a.route_scale = static_cast<float>(c.routed_scaling_factor);
  a.ids = ids;
  a.weights = weights;
  a.scratch = scratch;
  return a;
}

// A RopeTail over rows of k columns: pairs inside the rows' 32-blocks (k - rope_dim even).
static void check_rope_tail(const RopeTail& r, int64_t k, const char* op) {
  if (!r.freqs) return;
  DSV_CHECK(r.rope_dim > 0 && r.rope_dim % 2 == 0 && r.rope_dim <= k && (k - r.rope_dim) % 2 == 0,
            "{}: rope_dim={} must be even, positive, and leave an even head of the {} columns", op, r.rope_dim, k);
  DSV_CHECK(r.row_div >= 1, "{}: rope row_div={} must be positive", op, r.row_div);
}

void check_rms_norm_args(const RmsNormArgs& a, const char* op) {
  DSV_CHECK(a.rows >= 0 && a.d > 0, "{}: rows={} d={}", op, a.rows, a.d);
  DSV_CHECK(a.rows == 0 || (a.x && a.w && a.out), "{}: x, w and out must be device pointers", op);
  DSV_CHECK(a.x_stride >= a.d && a.out_stride >= a.d, "{}: strides {} / {} below d={}", op, a.x_stride, a.out_stride,
            a.d);
  DSV_CHECK(!a.codes == !a.scales, "{}: codes and scales go together", op);
  DSV_CHECK(!a.codes || a.d % 32 == 0, "{}: quantised output needs d={} to be a multiple of 32", op, a.d);
  DSV_CHECK((!a.rope.freqs && !a.qdq8) || a.d % 32 == 0, "{}: fused rope/qdq8 needs d={} to be a multiple of 32", op,
            a.d);
  check_rope_tail(a.rope, a.d, op);
  DSV_CHECK(!a.bf16_out || a.bf16_stride >= a.d, "{}: bf16 copy stride {} below d={}", op, a.bf16_stride, a.d);
}

void rms_norm(const RmsNormArgs& a, cudaStream_t s) {
  check_rms_norm_args(a, "rms_norm");
  launched(raw::rms_norm(a, s), "rms_norm launch");
}

void rope(const RopeArgs& a, cudaStream_t s) {
  DSV_CHECK(a.rope_dim > 0 && a.rope_dim % 2 == 0, "rope: rope_dim={} must be even and positive", a.rope_dim);
  DSV_CHECK(a.rows >= 0 && a.vecs >= 1, "rope: rows={} vecs={}", a.rows, a.vecs);
  DSV_CHECK(a.rows == 0 || (a.v && a.freqs), "rope: v and freqs must be device pointers");
  launched(raw::rope(a, s), "rope launch");
}

void qdq(const QdqArgs& a, cudaStream_t s) {
  DSV_CHECK(a.k > 0 && a.k % 32 == 0, "qdq: k={} must be a positive multiple of 32", a.k);
  DSV_CHECK(a.rows >= 0 && a.stride >= a.k, "qdq: rows={} stride={} k={}", a.rows, a.stride, a.k);
  DSV_CHECK(a.rows == 0 || a.x, "qdq: x must be a device pointer");
  check_rope_tail(a.rope, a.k, "qdq");
  launched(raw::qdq(a, s), "qdq launch");
}

void act_quant8(const ActQuantArgs& a, cudaStream_t s) {
  DSV_CHECK(a.k > 0 && a.k % 32 == 0, "act_quant8: k={} must be a positive multiple of 32", a.k);
  DSV_CHECK(a.rows >= 0 && a.x_stride >= a.k, "act_quant8: rows={} x_stride={} k={}", a.rows, a.x_stride, a.k);
  DSV_CHECK(a.rows == 0 || (a.x && a.codes && a.scales), "act_quant8: x, codes and scales must be device pointers");
  launched(raw::act_quant8(a, s), "act_quant8 launch");
}

void lin8(const Lin8Args& a, cudaStream_t s) {
  DSV_CHECK(a.w.in > 0 && a.w.in % 32 == 0 && a.w.out > 0, "lin8: in={} (multiple of 32) out={}", a.w.in, a.w.out);
  DSV_CHECK(a.m >= 0 && a.y_stride >= a.w.out, "lin8: m={} y_stride={} out={}", a.m, a.y_stride, a.w.out);
  DSV_CHECK(a.w.codes && a.w.scales && (a.m == 0 || (a.x_codes && a.x_scales && a.y)),
            "lin8: weight, activation and output pointers must be set");
  DSV_CHECK(aligned16(a.w.codes) && (a.m == 0 || aligned16(a.x_codes)), "lin8: codes must be 16-byte aligned");
  DSV_CHECK(a.rows16 == nullptr || aligned16(a.rows16), "lin8: f16 row scratch must be 16-byte aligned");
  launched(raw::lin8(a, s), "lin8 launch");
}

void lin4(const Lin4Args& a, cudaStream_t s) {
  DSV_CHECK(a.w.in > 0 && a.w.in % 32 == 0 && a.w.out > 0 && a.w.n_experts >= 1,
            "lin4: in={} (multiple of 32) out={} experts={}", a.w.in, a.w.out, a.w.n_experts);
  DSV_CHECK(a.rows >= 0 && a.x_row_div >= 1 && a.y_stride >= a.w.out, "lin4: rows={} x_row_div={} y_stride={}",
            a.rows, a.x_row_div, a.y_stride);
  DSV_CHECK(a.w.packed && a.w.scales && (a.rows == 0 || (a.x_codes && a.x_scales && a.y)),
            "lin4: weight, activation and output pointers must be set");
  DSV_CHECK(aligned16(a.w.packed) && (a.rows == 0 || aligned16(a.x_codes)), "lin4: codes must be 16-byte aligned");
  launched(raw::lin4(a, s), "lin4 launch");
}

void lin8_group(const Lin8GroupArgs& g, cudaStream_t s) {
  DSV_CHECK(g.count >= 1 && g.count <= kLinGroupMax, "lin8_group: count={} (1..{})", g.count, kLinGroupMax);
  const Lin8Args& a = g.lin[0];
  for (int p = 0; p < g.count; ++p) {
    const Lin8Args& l = g.lin[p];
    DSV_CHECK(l.w.in > 0 && l.w.in % 32 == 0 && l.w.out > 0, "lin8_group: linear {}: in={} (multiple of 32) out={}", p,
              l.w.in, l.w.out);
    DSV_CHECK(l.w.in == a.w.in && l.x_codes == a.x_codes && l.x_scales == a.x_scales && l.m == a.m &&
                  l.round_bf16 == a.round_bf16 && l.exact_block_sums == a.exact_block_sums &&
                  l.row_invariant == a.row_invariant,
              "lin8_group: linear {} must read the same input (in, codes, scales, m, rounding, block sums, row invariance) as "
              "linear 0",
              p);
    DSV_CHECK(l.m >= 0 && l.y_stride >= l.w.out, "lin8_group: linear {}: m={} y_stride={} out={}", p, l.m, l.y_stride,
              l.w.out);
    DSV_CHECK(l.w.codes && l.w.scales && (l.m == 0 || (l.x_codes && l.x_scales && l.y)),
              "lin8_group: linear {}: weight, activation and output pointers must be set", p);
    DSV_CHECK(aligned16(l.w.codes) && (l.m == 0 || aligned16(l.x_codes)), "lin8_group: linear {}: codes must be 16-byte aligned",
              p);
  }
  DSV_CHECK(a.rows16 == nullptr || aligned16(a.rows16), "lin8_group: f16 row scratch must be 16-byte aligned");
  if (lin_groups_enabled()) {
    launched(raw::lin8_group(g, s), "lin8_group launch");
  } else {
    for (int p = 0; p < g.count; ++p) launched(raw::lin8(g.lin[p], s), "lin8 launch");
  }
}

void lin4_group(const Lin4GroupArgs& g, cudaStream_t s) {
  DSV_CHECK(g.count >= 1 && g.count <= kLinGroupMax, "lin4_group: count={} (1..{})", g.count, kLinGroupMax);
  const Lin4Args& a = g.lin[0];
  for (int p = 0; p < g.count; ++p) {
    const Lin4Args& l = g.lin[p];
    DSV_CHECK(l.w.in > 0 && l.w.in % 32 == 0 && l.w.out > 0 && l.w.n_experts >= 1,
              "lin4_group: linear {}: in={} (multiple of 32) out={} experts={}", p, l.w.in, l.w.out, l.w.n_experts);
    DSV_CHECK(l.w.in == a.w.in && l.w.n_experts == a.w.n_experts && l.x_codes == a.x_codes &&
                  l.x_scales == a.x_scales && l.rows == a.rows && l.expert_ids == a.expert_ids &&
                  l.x_row_div == a.x_row_div && l.round_bf16 == a.round_bf16,
              "lin4_group: linear {} must read the same input (in, experts, codes, scales, rows, expert ids, row "
              "divisor, rounding) as linear 0",
              p);
    DSV_CHECK(l.rows >= 0 && l.x_row_div >= 1 && l.y_stride >= l.w.out, "lin4_group: linear {}: rows={} x_row_div={} y_stride={}",
              p, l.rows, l.x_row_div, l.y_stride);
    DSV_CHECK(l.w.packed && l.w.scales && (l.rows == 0 || (l.x_codes && l.x_scales && l.y)),
              "lin4_group: linear {}: weight, activation and output pointers must be set", p);
    DSV_CHECK(aligned16(l.w.packed) && (l.rows == 0 || aligned16(l.x_codes)),
              "lin4_group: linear {}: codes must be 16-byte aligned", p);
  }
  if (lin_groups_enabled()) {
    launched(raw::lin4_group(g, s), "lin4_group launch");
  } else {
    for (int p = 0; p < g.count; ++p) launched(raw::lin4(g.lin[p], s), "lin4 launch");
  }
}

void lin_dense(const DenseArgs& a, cudaStream_t s) {
  DSV_CHECK(a.in > 0 && a.out > 0 && a.groups >= 1 && a.groups <= 65535, "lin_dense: in={} out={} groups={}", a.in,
            a.out, a.groups);
  DSV_CHECK(a.m >= 0 && a.x_stride >= a.in * a.groups && a.y_stride >= a.out * a.groups,
            "lin_dense: m={} x_stride={} y_stride={} for {} groups of {}x{}", a.m, a.x_stride, a.y_stride, a.groups,
            a.in, a.out);
  DSV_CHECK(a.w && (a.m == 0 || (a.x && a.y)), "lin_dense: w, x and y must be device pointers");
  launched(raw::lin_dense(a, s), "lin_dense launch");
}

void hc_mix(const HcMixArgs& a, cudaStream_t s) {
  DSV_CHECK(a.hc >= 1 && a.hc <= 16 && a.dim > 0 && a.n >= 0 && a.iters >= 1, "hc_mix: hc={} (1..16) dim={} iters={}",
            a.hc, a.dim, a.iters);
  DSV_CHECK(a.n == 0 || (a.h && a.fn && a.base && a.scale && a.mix), "hc_mix: all pointers must be set");
  DSV_CHECK(a.k_parts >= model::kMixGemmBlocked && a.k_parts <= 32, "hc_mix: k_parts={} outside -1..32", a.k_parts);
  DSV_CHECK(a.k_parts == model::kMixGemmChunks || model::mix_gemm_part_count(a.hc * a.dim, a.k_parts) <= kMaxMixParts,
            "hc_mix: {} K parts over K = {} (at most {})", model::mix_gemm_part_count(a.hc * a.dim, a.k_parts),
            a.hc * a.dim, kMaxMixParts);
  launched(raw::hc_mix(a, s), "hc_mix launch");
}

void check_hc_collapse_args(const HcCollapseArgs& a, const char* op) {
  DSV_CHECK(a.hc >= 1 && a.hc <= 16 && a.dim > 0 && a.n >= 0, "{}: hc={} dim={} n={}", op, a.hc, a.dim, a.n);
  DSV_CHECK(a.n == 0 || (a.h && a.w && a.out), "{}: h, w and out must be device pointers", op);
}

void hc_collapse(const HcCollapseArgs& a, cudaStream_t s) {
  check_hc_collapse_args(a, "hc_collapse");
  launched(raw::hc_collapse(a, s), "hc_collapse launch");
}

void hc_expand(const HcExpandArgs& a, cudaStream_t s) {
  DSV_CHECK(a.hc >= 1 && a.hc <= 16 && a.dim > 0 && a.n >= 0, "hc_expand: hc={} dim={}", a.hc, a.dim);
  DSV_CHECK(a.n == 0 || (a.h && (a.y || a.routed) && a.mix), "hc_expand: h, y and mix must be device pointers");
  DSV_CHECK(!a.routed || (a.top_k >= 1 && (a.n == 0 || (a.ids && a.shared))),
            "hc_expand: the fused combine needs top_k={} >= 1, ids and shared", a.top_k);
  launched(raw::hc_expand(a, s), "hc_expand launch");
}

void router(const RouterArgs& a, cudaStream_t s) {
  DSV_CHECK(a.n_experts >= 1 && a.n_experts <= 1024, "router: n_experts={} outside 1..1024", a.n_experts);
  DSV_CHECK(a.top_k >= 1 && a.top_k <= 32 && a.top_k <= a.n_experts, "router: top_k={} outside 1..min(32, {})",
            a.top_k, a.n_experts);
  DSV_CHECK(a.dim > 0 && a.n >= 0 && a.temp > 0.0f, "router: dim={} n={} temp={}", a.dim, a.n, a.temp);
  DSV_CHECK(a.n == 0 || (a.x && a.gate_w && a.gate_bias && a.ids && a.weights && a.scratch),
            "router: x, gate_w, gate_bias, ids, weights and scratch must be device pointers");
  launched(raw::router(a, s), "router launch");
}

void swiglu(const SwigluArgs& a, cudaStream_t s) {
  DSV_CHECK(a.rows >= 0 && a.inter > 0, "swiglu: rows={} inter={}", a.rows, a.inter);
  DSV_CHECK(a.rows == 0 || (a.g && a.u && a.out), "swiglu: g, u and out must be device pointers");
  DSV_CHECK(!a.codes == !a.scales, "swiglu: codes and scales go together");
  DSV_CHECK(!a.codes || a.inter % 32 == 0, "swiglu: quantised output needs inter={} to be a multiple of 32", a.inter);
  launched(raw::swiglu(a, s), "swiglu launch");
}

void moe_combine(const MoeCombineArgs& a, cudaStream_t s) {
  DSV_CHECK(a.n >= 0 && a.top_k >= 1 && a.dim > 0, "moe_combine: n={} top_k={} dim={}", a.n, a.top_k, a.dim);
  DSV_CHECK(a.n == 0 || (a.routed && a.ids && a.shared && a.out), "moe_combine: all pointers must be set");
  launched(raw::moe_combine(a, s), "moe_combine launch");
}

void moe_grouped(const MoeGroupedArgs& a, cudaStream_t s) {
  const int64_t dim = a.w1.in, inter = a.w1.out, E = a.w1.n_experts;
  DSV_CHECK(moe_grouped_supported(dim, inter), "moe_grouped: hidden {} and intermediate {} must be positive multiples of {}",
            dim, inter, kMoeGroupedKStep);
  DSV_CHECK(a.w3.in == dim && a.w3.out == inter && a.w3.n_experts == E && a.w2.in == inter && a.w2.out == dim &&
                a.w2.n_experts == E,
            "moe_grouped: banks disagree: w1 {}x{}x{}, w3 {}x{}x{}, w2 {}x{}x{} (experts x out x in)", E, inter, dim,
            a.w3.n_experts, a.w3.out, a.w3.in, a.w2.n_experts, a.w2.out, a.w2.in);
  DSV_CHECK(E >= 1 && E <= 1024, "moe_grouped: {} experts outside 1..1024", E);
  DSV_CHECK(a.n >= 0 && a.top_k >= 1 && a.n * a.top_k < (int64_t{1} << 31), "moe_grouped: n={} top_k={}", a.n, a.top_k);
  const int64_t pairs = a.n * a.top_k;
  DSV_CHECK(moe_grouped_max_tiles(pairs, E) <= 65535, "moe_grouped: {} pairs over {} experts exceed the tile grid", pairs, E);
  DSV_CHECK(a.w1.packed && a.w1.scales && a.w3.packed && a.w3.scales && a.w2.packed && a.w2.scales,
            "moe_grouped: weight pointers must be set");
  DSV_CHECK(aligned16(a.w1.packed) && aligned16(a.w3.packed) && aligned16(a.w2.packed),
            "moe_grouped: packed weights must be 16-byte aligned");
  const auto aligned4 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  DSV_CHECK(aligned4(a.w1.scales) && aligned4(a.w3.scales) && aligned4(a.w2.scales),
            "moe_grouped: weight scales must be 4-byte aligned");
  if (pairs > 0) {
    DSV_CHECK(a.x_codes && a.x_scales && a.expert_ids && a.route_w && a.act && a.act_codes && a.act_scales && a.sort && a.y,
              "moe_grouped: activation, routing, scratch and output pointers must be set");
    DSV_CHECK(aligned16(a.x_codes) && aligned16(a.x_scales) && aligned16(a.act_codes) && aligned16(a.act_scales),
              "moe_grouped: activation codes and scales must be 16-byte aligned");
    DSV_CHECK(a.sort_ints >= moe_grouped_sort_ints(pairs, E), "moe_grouped: sort scratch of {} ints, {} needed", a.sort_ints,
              moe_grouped_sort_ints(pairs, E));
    // The kernels address activation rows in 16-byte chunks with 32-bit offsets.
    DSV_CHECK(std::max(a.n * dim, pairs * inter) < (int64_t{1} << 34),
              "moe_grouped: {} tokens x {} / {} pairs x {} exceed 2^34 values", a.n, dim, pairs, inter);
    const int64_t rows16_need = moe_grouped_rows16_bytes(a.n, a.top_k, dim, inter);
    DSV_CHECK(a.rows16 == nullptr || (aligned16(a.rows16) && a.rows16_bytes >= rows16_need),
              "moe_grouped: f16 row scratch of {} bytes, {} needed (16-byte aligned)", a.rows16_bytes, rows16_need);
  }
  launched(raw::moe_grouped(a, s), "moe_grouped launch");
}

void engram_dequant(const EngramDequantArgs& a, cudaStream_t s) {
  DSV_CHECK(a.head_dim > 0 && a.row_bytes >= a.head_dim + (a.head_dim + 31) / 32,
            "engram_dequant: row_bytes={} too small for head_dim={}", a.row_bytes, a.head_dim);
  DSV_CHECK(a.n_out == 0 || (a.rows && a.slots && a.out), "engram_dequant: rows, slots and out must be set");
  launched(raw::engram_dequant(a, s), "engram_dequant launch");
}

void engram_gate(const EngramGateArgs& a, cudaStream_t s) {
  DSV_CHECK(a.hc >= 1 && a.hc <= 65535 && a.dim > 0 && a.n >= 0, "engram_gate: hc={} dim={}", a.hc, a.dim);
  DSV_CHECK(a.n == 0 || (a.h && a.kv && a.gate_w), "engram_gate: h, kv and gate_w must be device pointers");
  launched(raw::engram_gate(a, s), "engram_gate launch");
}

void indexer_scores(const IndexerArgs& a, cudaStream_t s) {
  DSV_CHECK(a.heads >= 1 && a.heads <= 128 && a.head_dim > 0, "indexer_scores: heads={} (1..128) head_dim={}", a.heads,
            a.head_dim);
  DSV_CHECK(a.ratio >= 1 && a.T >= 0 && a.n >= 0 && a.n_keys >= 0 && a.start >= 0,
            "indexer_scores: ratio={} T={} n={} n_keys={} start={}", a.ratio, a.T, a.n, a.n_keys, a.start);
  DSV_CHECK(a.n == 0 || a.T == 0 || (a.qi && a.w && a.scores && (a.n_keys == 0 || a.keys)),
            "indexer_scores: qi, w, keys and scores must be device pointers");
  launched(raw::indexer_scores(a, s), "indexer_scores launch");
}

void topk_sorted(const TopkArgs& a, cudaStream_t s) {
  DSV_CHECK(a.rows >= 0 && a.n >= 0 && a.stride >= a.n && a.k >= 0 && a.k <= a.n, "topk_sorted: rows={} n={} k={} stride={}",
            a.rows, a.n, a.k, a.stride);
  DSV_CHECK(a.ratio >= 0 && a.n < (int64_t{1} << 31), "topk_sorted: ratio={} n={}", a.ratio, a.n);
  DSV_CHECK(a.rows == 0 || a.k == 0 || (a.values && a.out), "topk_sorted: values and out must be device pointers");
  launched(raw::topk_sorted(a, s), "topk_sorted launch");
}

bool topk_replay_fits(int64_t n, int64_t k) {
  if (k < 1 || k > n) return false;
  if (k * 64 > n) return n <= 65535;  // nth_element: uint16 column indices beside the row
  return k <= kTopkHeapMaxK && n <= INT32_MAX;  // partial_sort: a heap of k nodes in shared memory
}

void topk_replay(const TopkReplayArgs& a, cudaStream_t s) {
  DSV_CHECK(a.rows >= 0 && a.stride >= a.n && topk_replay_fits(a.n, a.k),
            "topk_replay: rows={} n={} k={} stride={} (needs 1 <= k <= n, and n <= 65535 when k*64 > n, else k <= {})",
            a.rows, a.n, a.k, a.stride, kTopkHeapMaxK);
  DSV_CHECK(a.ratio >= 0 && a.pos0 >= 0 && (!a.positions || a.ratio > 0), "topk_replay: ratio={} pos0={}{}", a.ratio,
            a.pos0, a.positions ? " with positions" : "");
  DSV_CHECK(a.rows == 0 || (a.values && a.idx && a.out), "topk_replay: values, idx and out must be device pointers");
  launched(raw::topk_replay(a, s), "topk_replay launch");
}

void candidate_blocks(const CandidateArgs& a, cudaStream_t s) {
  DSV_CHECK(a.block_size >= 1 && a.topk_blocks >= 1 && a.ratio >= 1, "candidate_blocks: block_size={} topk_blocks={} ratio={}",
            a.block_size, a.topk_blocks, a.ratio);
  DSV_CHECK(a.n == 0 || a.T == 0 || (a.scores && a.block_scores && a.block_idx && a.block_sel && a.keep),
            "candidate_blocks: all pointers must be set");
  const int64_t nb = (a.T + a.block_size - 1) / a.block_size;
  DSV_CHECK(a.T == 0 || topk_replay_fits(nb, std::min(a.topk_blocks, nb)),
            "candidate_blocks: {} blocks keeping {} is outside the exact selection's branch", nb, a.topk_blocks);
  launched(raw::candidate_blocks(a, s), "candidate_blocks launch");
}

void candidate_mask(const CandidateMaskArgs& a, cudaStream_t s) {
  DSV_CHECK(a.block_size >= 1 && a.T >= 0 && a.width >= 0, "candidate_mask: block_size={} T={} width={}", a.block_size,
            a.T, a.width);
  DSV_CHECK(a.n == 0 || a.T == 0 || a.width == 0 || (a.scores && a.keep), "candidate_mask: scores and keep must be set");
  launched(raw::candidate_mask(a, s), "candidate_mask launch");
}

namespace {
void check_attn(const SparseAttnArgs& a) {
  DSV_CHECK(a.d > 0 && a.d <= 512 && a.d % 8 == 0, "sparse_attention: d={} must be a multiple of 8 up to 512", a.d);
  DSV_CHECK(a.heads >= 1 && a.n_q >= 0 && a.list_len >= 0 && a.split >= 0, "sparse_attention: heads={} n_q={} list_len={}",
            a.heads, a.n_q, a.list_len);
  DSV_CHECK(a.n_q == 0 || (a.q && a.list && a.pool_a && a.sink && a.out),
            "sparse_attention: q, list, pool_a, sink and out must be device pointers");
}
}  // namespace

void sparse_attention_decode(const SparseAttnArgs& a, cudaStream_t s) {
  check_attn(a);
  launched(raw::sparse_attention(a, 1, s), "sparse_attention_decode launch");
}

void sparse_attention_prefill(const SparseAttnArgs& a, cudaStream_t s) {
  check_attn(a);
  launched(raw::sparse_attention(a, kPrefillHeads, s), "sparse_attention_prefill launch");
}

void attn_lists(const AttnListArgs& a, cudaStream_t s) {
  DSV_CHECK(a.n >= 0 && a.win >= 1 && a.win_len >= 0 && a.topk_len >= 0 && a.start >= 0 && a.pos_base >= 0,
            "attn_lists: n={} win={} win_len={} topk_len={} start={}", a.n, a.win, a.win_len, a.topk_len, a.start);
  DSV_CHECK(!a.decode || a.win_len == a.win, "attn_lists: a decode list holds all {} ring slots, not {}", a.win, a.win_len);
  // Window entries index pool_a: a decode list holds every ring slot (< win); a prefill list the
  // staged positions up to the chunk end (< start + n - pos_base), whatever win_len is.
  const int64_t win_rows = a.decode ? a.win_len : a.start + a.n - a.pos_base;
  DSV_CHECK(a.split >= win_rows && a.split + a.n_entries < (int64_t{1} << 31),
            "attn_lists: split={} below the {} window rows the list can name", a.split, win_rows);
  DSV_CHECK(a.n == 0 || (a.list && (a.topk_len == 0 || a.topk)), "attn_lists: list and topk must be device pointers");
  launched(raw::attn_lists(a, s), "attn_lists launch");
}

void stage_window(const StageWindowArgs& a, cudaStream_t s) {
  DSV_CHECK(a.win >= 1 && a.d > 0 && a.n >= 0 && a.start >= 0, "stage_window: win={} d={} n={} start={}", a.win, a.d,
            a.n, a.start);
  DSV_CHECK(a.out && (a.n == 0 || a.kv) && (a.start == 0 || a.ring), "stage_window: ring, kv and out must be set");
  launched(raw::stage_window(a, s), "stage_window launch");
}

void embed(const EmbedArgs& a, cudaStream_t s) {
  DSV_CHECK(a.vocab > 0 && a.dim > 0 && a.hc >= 1 && a.n >= 0, "embed: vocab={} dim={} hc={} n={}", a.vocab, a.dim,
            a.hc, a.n);
  DSV_CHECK(a.n == 0 || (a.table && a.tokens && a.out), "embed: table, tokens and out must be device pointers");
  launched(raw::embed(a, s), "embed launch");
}

void argmax(const ArgmaxArgs& a, cudaStream_t s) {
  DSV_CHECK(a.rows >= 0 && a.n >= 1 && a.n < (int64_t{1} << 31), "argmax: rows={} n={}", a.rows, a.n);
  DSV_CHECK(a.rows == 0 || (a.x && a.out), "argmax: x and out must be device pointers");
  launched(raw::argmax(a, s), "argmax launch");
}

void compress_pool(const CompressPoolArgs& a, cudaStream_t s) {
  DSV_CHECK(a.ratio >= 2 && a.ratio <= 16 && a.hd > 0 && a.n >= 0 && a.start >= 0, "compress_pool: ratio={} (2..16) hd={}",
            a.ratio, a.hd);
  DSV_CHECK(a.n == 0 || (a.av && a.gv && a.carry_kv && a.carry_score && a.pooled), "compress_pool: all pointers must be set");
  launched(raw::compress_pool(a, s), "compress_pool launch");
}

void store_bf16(const StoreBf16Args& a, cudaStream_t s) {
  DSV_CHECK(a.rows >= 0 && a.cols >= 0 && a.x_stride >= a.cols && a.dst_stride >= a.cols, "store_bf16: bad shape");
  DSV_CHECK(a.rows == 0 || a.cols == 0 || (a.x && a.dst), "store_bf16: x and dst must be device pointers");
  launched(raw::store_bf16(a, s), "store_bf16 launch");
}

void scale_round(const ScaleRoundArgs& a, cudaStream_t s) {
  DSV_CHECK(a.rows >= 0 && a.cols >= 0 && a.stride >= a.cols, "scale_round: rows={} cols={} stride={}", a.rows, a.cols,
            a.stride);
  DSV_CHECK(a.rows == 0 || a.cols == 0 || a.x, "scale_round: x must be a device pointer");
  launched(raw::scale_round(a, s), "scale_round launch");
}

void fill_pointers(const FillPointersArgs& a, cudaStream_t s) {
  DSV_CHECK(a.n >= 0 && (a.n == 0 || a.dst), "fill_pointers: n={} needs a device array", a.n);
  launched(raw::fill_pointers(a, s), "fill_pointers launch");
}

void stream_mean(const StreamMeanArgs& a, cudaStream_t s) {
  DSV_CHECK(a.n >= 0 && a.hc >= 1 && a.dim >= 1 && a.out_stride >= a.dim, "stream_mean: n={} hc={} dim={} out_stride={}",
            a.n, a.hc, a.dim, a.out_stride);
  DSV_CHECK(a.n == 0 || (a.h && a.out), "stream_mean: h and out must be device pointers");
  launched(raw::stream_mean(a, s), "stream_mean launch");
}

void markov_bias(const MarkovBiasArgs& a, cudaStream_t s) {
  // The rows' embedding vectors are staged in 48 KiB of shared memory (8 rows per block).
  DSV_CHECK(a.rows >= 0 && a.vocab >= 1 && a.rank >= 1 && a.rank <= 1536 && a.logits_stride >= a.vocab,
            "markov_bias: rows={} vocab={} rank={} (1..1536) logits_stride={}", a.rows, a.vocab, a.rank, a.logits_stride);
  DSV_CHECK(a.rows == 0 || (a.logits && a.head_t && a.embed && a.ids), "markov_bias: all pointers must be device pointers");
  launched(raw::markov_bias(a, s), "markov_bias launch");
}

}  // namespace dsv41::ops::gpu
#endif
