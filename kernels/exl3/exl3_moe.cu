// Host launcher of the grouped MoE kernels (planning and validation: src/ops/exl3_gpu.cpp).
#include "exl3/exl3_moe.h"

#include <algorithm>
#include "exl3/exl3_moe_kernel.cuh"

namespace dsv41::exl3::dev {
cudaError_t launch_moe_gate_up(const MoeArgs& a, size_t smem, cudaStream_t stream);
cudaError_t launch_moe_down(const MoeArgs& a, size_t smem, cudaStream_t stream);
cudaError_t launch_moe_stage_gate_up(const MoeArgs& a, cudaStream_t stream);
cudaError_t launch_moe_stage_down(const MoeArgs& a, cudaStream_t stream);
}  // namespace dsv41::exl3::dev

namespace dsv41::exl3::cuda {
namespace {

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

struct MoeLayout {
  size_t part_gu, act, part_dn, x_gu, stats_gu, x_dn, stats_dn, total;
};

MoeLayout layout(const MoeParams& p, const MoePlan& plan) {
  MoeLayout l{};
  size_t off = kCounterBytes;
  l.part_gu = off;
  off += align256(static_cast<size_t>(plan.max_slots) * 2 * plan.splits_gu * 8 * p.inter * 4);
  l.act = off;
  off += align256(static_cast<size_t>(plan.max_slots) * 8 * p.inter * 4);
  l.part_dn = off;
  off += align256(static_cast<size_t>(plan.max_slots) * plan.splits_dn * 8 * p.hidden * 4);
  l.x_gu = off;
  off += align256(static_cast<size_t>(plan.max_slots) * 2 * p.hidden * 32);
  l.stats_gu = off;
  off += align256(static_cast<size_t>(plan.max_slots) * 2 * plan.splits_gu * 4 * 16);
  l.x_dn = off;
  off += align256(static_cast<size_t>(plan.max_slots) * p.inter * 32);
  l.stats_dn = off;
  off += align256(static_cast<size_t>(plan.max_slots) * plan.splits_dn * 4 * 16);
  l.total = off;
  return l;
}

}  // namespace

size_t moe_smem_bytes(int max_bits, int rows) {
  // Any K up to max_bits may run (the ring depth makes the size non-monotonic in K).
  int most = 0;
  for (int K = 1; K <= max_bits; ++K) {
    most = std::max(most, dev::small_smem_bytes(K, true, rows));
    most = std::max(most, dev::small_smem_bytes(K, false, rows));
  }
  return static_cast<size_t>(most);
}

size_t moe_workspace_bytes(const MoeParams& p, const MoePlan& plan) {
  return plan.stream ? moe_stream_workspace_bytes(p, plan) : layout(p, plan).total;
}

cudaError_t launch_moe(const MoeParams& p, const MoePlan& plan, cudaStream_t stream) {
  if (plan.stream) return launch_moe_stream(p, plan, stream);
  const MoeLayout l = layout(p, plan);
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  dev::MoeArgs a{};
  a.p = p;
  a.max_slots = plan.max_slots;
  a.splits_gu = plan.splits_gu;
  a.kt_gu = plan.kt_gu;
  a.splits_dn = plan.splits_dn;
  a.kt_dn = plan.kt_dn;
  a.int8 = plan.int8;
  a.ctr_gu = reinterpret_cast<int*>(ws);
  a.ctr_dn = a.ctr_gu + plan.max_slots * (p.inter / 128);
  a.part_gu = reinterpret_cast<float*>(ws + l.part_gu);
  a.act = reinterpret_cast<float*>(ws + l.act);
  a.part_dn = reinterpret_cast<float*>(ws + l.part_dn);
  a.x_gu = ws + l.x_gu;
  a.stats_gu = reinterpret_cast<int4*>(ws + l.stats_gu);
  a.x_dn = ws + l.x_dn;
  a.stats_dn = reinterpret_cast<int4*>(ws + l.stats_dn);
  cudaError_t e = dev::launch_moe_stage_gate_up(a, stream);
  if (e != cudaSuccess) return e;
  e = dev::launch_moe_gate_up(a, plan.smem_gu, stream);
  if (e != cudaSuccess) return e;
  e = dev::launch_moe_stage_down(a, stream);
  if (e != cudaSuccess) return e;
  return dev::launch_moe_down(a, plan.smem_dn, stream);
}

}  // namespace dsv41::exl3::cuda
