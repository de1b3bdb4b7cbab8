// Device code of the grouped MoE kernels (see exl3_moe.h).
#pragma once
#include "exl3/exl3_block.cuh"
#include "exl3/exl3_moe.h"

namespace dsv41::exl3::dev {

constexpr int kMoeMaxExperts = 1024;  // bitmap of 32 words
constexpr int kMoeMaxSlots = 8 * 16 + 1;

struct MoeArgs {
  cuda::MoeParams p;
  int max_slots, splits_gu, kt_gu, splits_dn, kt_dn;
  bool int8;
  int* ctr_gu;    // [max_slots][inter/128]
  int* ctr_dn;    // [hidden/128]
  float* part_gu; // [max_slots][2][splits_gu][8][inter]
  float* act;     // [max_slots][8][inter]  (down input, Hadamard basis)
  float* part_dn; // [max_slots][splits_dn][8][hidden]
  // x staged once per (slot, projection) by the staging kernels, in small_block's xpre format
  // (int8 fragments [k/16][32] uint4 or fp16 rows [8][k]; hidden * 32 / inter * 32 bytes each),
  // with the int8 statistics per k-split.
  unsigned char* x_gu;  // [max_slots][2]
  int4* stats_gu;       // [max_slots][2][splits_gu][4]
  unsigned char* x_dn;  // [max_slots]
  int4* stats_dn;       // [max_slots][splits_dn][4]
};

struct SlotTable {
  int n;
  int expert[kMoeMaxSlots];
  float weight[kMoeMaxSlots][8];
};

// Distinct selected experts in increasing id, then the shared expert; per-token routing weights
// (0 where a token did not select the expert). Every block builds the same table; only the slots
// a routing can fill (m·topk routed + the shared one) are written.
__device__ inline void build_slots(const cuda::MoeParams& p, SlotTable& st) {
  __shared__ uint32_t bits[32];
  __shared__ int before[32];
  const int tid = threadIdx.x;
  const int nsel = p.m * p.topk;
  if (tid < 32) bits[tid] = 0u;
  for (int i = tid; i < (nsel + 1) * 8; i += kThreads) (&st.weight[0][0])[i] = 0.0f;
  __syncthreads();
  for (int i = tid; i < nsel; i += kThreads) {
    const int e = p.topk_ids[i];
    if (e >= 0 && e < p.n_experts) atomicOr(&bits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  if (tid < 32) {  // lane w: the slots of word w's experts, in increasing id
    int c = 0;
    for (int j = 0; j < tid; ++j) c += __popc(bits[j]);
    before[tid] = c;
    for (uint32_t w = bits[tid]; w; w &= w - 1u) st.expert[c++] = tid * 32 + __ffs(w) - 1;
  }
  __syncthreads();
  auto slot_of = [&](int e) { return before[e >> 5] + __popc(bits[e >> 5] & ((1u << (e & 31)) - 1u)); };
  const int nrouted = before[31] + __popc(bits[31]);
  // top-k ids of one token are distinct, so each (slot, token) is written at most once.
  for (int i = tid; i < nsel; i += kThreads) {
    const int e = p.topk_ids[i];
    if (e >= 0 && e < p.n_experts) st.weight[slot_of(e)][i / p.topk] = p.topk_weights[i];
  }
  if (tid == 0) {
    st.n = nrouted + (p.has_shared ? 1 : 0);
    if (p.has_shared) st.expert[nrouted] = p.n_experts;
  }
  if (p.has_shared && tid < p.m) st.weight[nrouted][tid] = 1.0f;
  __syncthreads();
}

// Runs the small-m block for a matrix whose K and codebook are known only at run time.
__device__ __forceinline__ float* small_block_any(const cuda::Exl3Matrix& w, int ng, int kt0, int kt1,
                                                  unsigned char* smem, bool int8, const void* xpre,
                                                  const int4* xstats) {
#define DSV41_EXL3_CASE(KK)                                                                          \
  case KK:                                                                                           \
    if (int8 && w.codebook == 2) return small_block<KK, 2, true>(w, ng, kt0, kt1, smem, xpre, xstats); \
    if (w.codebook == 0) return small_block<KK, 0, false>(w, ng, kt0, kt1, smem, xpre, xstats);       \
    if (w.codebook == 1) return small_block<KK, 1, false>(w, ng, kt0, kt1, smem, xpre, xstats);       \
    return small_block<KK, 2, false>(w, ng, kt0, kt1, smem, xpre, xstats);
  switch (w.bits) {
    DSV41_EXL3_CASE(1)
    DSV41_EXL3_CASE(2)
    DSV41_EXL3_CASE(3)
    DSV41_EXL3_CASE(4)
    DSV41_EXL3_CASE(5)
    DSV41_EXL3_CASE(6)
    DSV41_EXL3_CASE(7)
    default:
    DSV41_EXL3_CASE(8)
  }
#undef DSV41_EXL3_CASE
}

// The down projection's input at one (token, column) from the gate and up outputs gv, uv (bias
// added, rounded where the reference rounds): the clamped SwiGLU of MODEL.md §5.5 (u clamped to
// ±lim, g clamped above at lim; lim <= 0: no clamp), times the routing weight wt and the down
// matrix's suh value. A token that did not route to the expert (wt = 0) gives exactly 0.
__device__ __forceinline__ float swiglu_input(float gv, float uv, float wt, float lim, bool bf16_points, float suh) {
  if (lim > 0.0f) {
    gv = fminf(gv, lim);
    uv = fminf(fmaxf(uv, -lim), lim);
  }
  if (wt == 0.0f) return 0.0f;
  if (bf16_points) {  // the reference's operation order, no contraction, correctly rounded exp
    float act = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, static_cast<float>(exp(-static_cast<double>(gv))))), uv);
    act = __bfloat162float(__float2bfloat16_rn(__fmul_rn(wt, act)));
    return act * suh;
  }
  return gv / (1.0f + expf(-gv)) * uv * wt * suh;
}

// Claims a ticket of a group; true in the block that arrives last (which then resets it).
__device__ __forceinline__ bool last_arrival(int* ctr, int expected) {
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(ctr, 1) == expected - 1;
    if (last) *ctr = 0;
    s_last = last;
  }
  __syncthreads();
  if (s_last) __threadfence();
  return s_last;
}

}  // namespace dsv41::exl3::dev
