// Stream path of the grouped MoE layer (exl3_moe.h): the staging kernel of the gate/up input, the
// workspace layout and the three launches. The stream kernels themselves are instantiated with the
// linear kernels, one compile unit per K (exl3_gemm_inst.cuh).
#include "exl3/exl3_gemm_inst.cuh"
#include "exl3/exl3_launch.h"
#include "exl3/exl3_moe.h"

namespace dsv41::exl3::dev {

// One warp per (selected matrix 2·slot + proj, 128-row chunk, token r < 4 int8 / 8 f16): the
// matrix's x_had (its own suh) staged as stage_int8_kernel / stage_f16_kernel stage a linear's.
template <bool INT8>
__global__ void __launch_bounds__(kThreads) moe_stream_stage_kernel(const MoeStreamArgs a) {
  __shared__ SlotTable st;
  griddep_wait();  // x and the routing come from earlier kernels
  griddep_launch_dependents();
  const cuda::MoeParams& p = a.p;
  build_slots(p, st);
  constexpr int TOKS = INT8 ? 4 : 8;
  const int lane = threadIdx.x & 31;
  const int k = a.s.w.k, nchunks = k / 128;
  int item = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (item >= TOKS * nchunks * 2 * st.n) return;
  const int mat = item / (TOKS * nchunks);
  item -= mat * TOKS * nchunks;
  const int chunk = item / TOKS, r = item % TOKS;
  const cuda::Exl3Matrix& w = moe_matrix(a, st, mat);
  if (w.k != k || w.n != a.s.w.n || w.bits != a.s.w.bits || w.codebook != a.s.w.codebook)
    __trap();  // not the kind the planner was told
  const XSource xs{p.x, static_cast<int>(p.x_type), 0, p.m, p.x_stride, p.x_cols, w.suh};
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (r < p.m) load4(xs, r, static_cast<int64_t>(chunk) * 128 + 4 * lane, v);
  unsigned char* frag = static_cast<unsigned char*>(const_cast<void*>(a.s.xfrag)) + mat * a.s.xfrag_batch_bytes;
  if constexpr (INT8) {
    stage_int8_warp(v, r, chunk, reinterpret_cast<uint32_t*>(frag),
                    const_cast<float2*>(a.s.qstats) + static_cast<size_t>(mat) * nchunks * 4);
  } else {
    stage_f16_warp(v, r, chunk, reinterpret_cast<__half*>(frag));
  }
}

}  // namespace dsv41::exl3::dev

namespace dsv41::exl3::cuda {
namespace {

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

dev::MoeStreamKernelFn moe_stream_fn(int bits, int codebook, bool int8) {
  if (bits < 1 || bits > 8 || codebook < 0 || codebook > 2) return nullptr;
  const dev::KernelTable& t = dev::kernel_table(bits);
  if (int8) return codebook == 2 ? t.moe_int8 : nullptr;
  return t.moe_f16[codebook];
}

// Counters (ints, in the first kCounterBytes): the gate/up stream's column-group tickets
// [max_slots·2][inter/128], its gate-and-up tickets [max_slots][inter/128], the down stream's
// tickets [max_slots][hidden/128], its expert tickets [hidden/128].
struct StreamLayout {
  size_t ctr_gu, fin_gu, ctr_dn, fin_dn, counters_end;
  size_t xbytes_gu, xbytes_dn;  // staged x per matrix
  size_t x_gu, q_gu, part_gu, out_gu, x_dn, q_dn, part_dn, out_dn, total;
};

StreamLayout stream_layout(const MoeParams& p, const MoePlan& plan) {
  StreamLayout l{};
  const size_t S = static_cast<size_t>(plan.max_slots), gi = p.inter / 128, gh = p.hidden / 128;
  l.ctr_gu = 0;
  l.fin_gu = l.ctr_gu + S * 2 * gi;
  l.ctr_dn = l.fin_gu + S * gi;
  l.fin_dn = l.ctr_dn + S * gh;
  l.counters_end = (l.fin_dn + gh) * 4;
  l.xbytes_gu = static_cast<size_t>(p.hidden) * (plan.int8_gu ? 32 : 16);
  l.xbytes_dn = static_cast<size_t>(p.inter) * (plan.int8_dn ? 32 : 16);
  size_t off = kCounterBytes;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  l.x_gu = take(S * 2 * l.xbytes_gu);
  l.q_gu = take(S * 2 * (p.hidden / 128) * 4 * sizeof(float2));
  l.part_gu = take(static_cast<size_t>(plan.grid_gu) * 2 * 8 * 128 * 4);
  l.out_gu = take(S * 2 * 8 * p.inter * 4);
  l.x_dn = take(S * l.xbytes_dn);
  l.q_dn = take(S * (p.inter / 128) * 4 * sizeof(float2));
  l.part_dn = take(static_cast<size_t>(plan.grid_dn) * 2 * 8 * 128 * 4);
  l.out_dn = take(S * 8 * p.hidden * 4);
  l.total = off;
  return l;
}

Exl3Matrix matrix_kind(int k, int n, int bits, int codebook) {
  Exl3Matrix w;
  w.k = k;
  w.n = n;
  w.bits = bits;
  w.codebook = codebook;
  return w;
}

// One projection's stream arguments: `kind` its matrices' shape, bits and codebook; the byte
// offsets of its staged x, int8 statistics, partial sums and outputs in the workspace.
dev::MoeStreamArgs projection_args(const MoeParams& p, int nproj, const Exl3Matrix& kind, unsigned char* ws, size_t x,
                                   size_t q, size_t part, size_t out, size_t xbytes, int* tickets, int* finish) {
  dev::MoeStreamArgs a{};
  a.p = p;
  a.nproj = nproj;
  a.s.w = kind;
  a.s.xfrag = ws + x;
  a.s.qstats = reinterpret_cast<const float2*>(ws + q);
  a.s.m = p.m;
  a.s.units_per_group = kind.k / 128;
  a.s.part = reinterpret_cast<float*>(ws + part);
  a.s.counters = tickets;
  a.s.xfrag_batch_bytes = xbytes;
  a.out = reinterpret_cast<float*>(ws + out);
  a.finish_ctr = finish;
  return a;
}

}  // namespace

int moe_stream_blocks_per_sm(int bits, int codebook, bool int8) {
  dev::MoeStreamKernelFn fn = moe_stream_fn(bits, codebook, int8);
  if (!fn) return 0;
  return resident_blocks_per_sm(fn, dev::stream_smem_bytes(bits, int8), dev::kThreads);
}

size_t moe_stream_workspace_bytes(const MoeParams& p, const MoePlan& plan) {
  const StreamLayout l = stream_layout(p, plan);
  return l.counters_end <= kCounterBytes ? l.total : 0;  // 0: the planner refuses the shape
}

cudaError_t launch_moe_stream(const MoeParams& p, const MoePlan& plan, cudaStream_t stream) {
  const StreamLayout l = stream_layout(p, plan);
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  int* ctr = reinterpret_cast<int*>(ws);
  dev::MoeStreamKernelFn fgu = moe_stream_fn(p.gate_up_bits, p.gate_up_codebook, plan.int8_gu);
  dev::MoeStreamKernelFn fdn = moe_stream_fn(p.down_bits, p.down_codebook, plan.int8_dn);
  if (!fgu || !fdn) return cudaErrorInvalidValue;

  dev::MoeStreamArgs gu =
      projection_args(p, 2, matrix_kind(p.hidden, p.inter, p.gate_up_bits, p.gate_up_codebook), ws, l.x_gu, l.q_gu,
                      l.part_gu, l.out_gu, l.xbytes_gu, ctr + l.ctr_gu, ctr + l.fin_gu);
  gu.next_x = ws + l.x_dn;
  gu.next_qstats = reinterpret_cast<float2*>(ws + l.q_dn);
  gu.next_int8 = plan.int8_dn;
  gu.next_x_bytes = l.xbytes_dn;
  const dev::MoeStreamArgs dn =
      projection_args(p, 1, matrix_kind(p.inter, p.hidden, p.down_bits, p.down_codebook), ws, l.x_dn, l.q_dn,
                      l.part_dn, l.out_dn, l.xbytes_dn, ctr + l.ctr_dn, ctr + l.fin_dn);

  const size_t smem_gu = dev::stream_smem_bytes(p.gate_up_bits, plan.int8_gu);
  const size_t smem_dn = dev::stream_smem_bytes(p.down_bits, plan.int8_dn);
  cudaError_t e = raise_smem_once(fgu, smem_gu);
  if (e == cudaSuccess) e = raise_smem_once(fdn, smem_dn);
  if (e != cudaSuccess) return e;
  const int toks = plan.int8_gu ? 4 : 8;
  const unsigned stage_blocks =
      static_cast<unsigned>((toks * (p.hidden / 128) * 2 * plan.max_slots + dev::kWarps - 1) / dev::kWarps);
  e = plan.int8_gu
          ? launch_pdl(dev::moe_stream_stage_kernel<true>, dim3(stage_blocks), dev::kThreads, 0, stream, gu)
          : launch_pdl(dev::moe_stream_stage_kernel<false>, dim3(stage_blocks), dev::kThreads, 0, stream, gu);
  if (e != cudaSuccess) return e;
  e = launch_pdl(fgu, dim3(plan.grid_gu), dev::kThreads, smem_gu, stream, gu);
  if (e != cudaSuccess) return e;
  return launch_pdl(fdn, dim3(plan.grid_dn), dev::kThreads, smem_dn, stream, dn);
}

}  // namespace dsv41::exl3::cuda
