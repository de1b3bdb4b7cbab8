// Top-k selection returning the chosen indices in ascending order (what the reference does with
// topk + sort): a 4-pass radix select finds the k-th largest key, then one ordered compaction pass
// keeps every larger entry and the first ties in index order. NaN ranks above everything, as in the
// reference. Among exactly tied values the reference's pick is implementation-defined (MODEL.md §7
// pitfall 10); this kernel takes the lowest indices. One block per row.
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 512;

// Order-preserving map of fp32 to uint32 (larger value -> larger key; NaN on top).
__device__ __forceinline__ uint32_t key_of(float v) {
  if (isnan(v)) return 0xFFFFFFFFu;
  if (v == 0.0f) v = 0.0f;  // -0 and +0 compare equal in the reference: one key
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix of `flag` over the block in thread order; `total` gets the block's count.
__device__ int block_exclusive_scan(int flag, int* warp_sums, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  const unsigned ballot = __ballot_sync(dev::kFull, flag);
  const int in_warp = __popc(ballot & ((1u << lane) - 1));
  __syncthreads();
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += warp_sums[w];
    total += warp_sums[w];
  }
  return before + in_warp;
}

__global__ void topk_kernel(TopkArgs a) {
  dev::pdl_enter();
  __shared__ int hist[256];
  __shared__ int warp_sums[kThreads / 32];
  __shared__ uint32_t s_prefix;
  __shared__ int s_krem;
  const int64_t row = blockIdx.x;
  const float* v = a.values + row * a.stride;
  int32_t* out = a.out + row * a.k;
  uint32_t prefix = 0, mask = 0;
  int krem = static_cast<int>(a.k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) {
      const uint32_t key = key_of(v[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, b = 255;
      for (; b > 0; --b) {
        if (cum + hist[b] >= krem) break;
        cum += hist[b];
      }
      s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      s_krem = krem - cum;
    }
    __syncthreads();
    prefix = s_prefix;
    krem = s_krem;
    mask |= 0xFFu << shift;
    __syncthreads();
  }
  // prefix is the k-th largest key; krem ties of it are taken, lowest index first.
  int written = 0, ties_seen = 0;
  const int64_t n_vis = a.ratio > 0 ? (a.pos0 + row + 1) / a.ratio : a.n;
  for (int64_t base = 0; base < a.n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    uint32_t key = 0;
    bool valid = i < a.n;
    if (valid) key = key_of(v[i]);
    const int tie = valid && key == prefix;
    int tie_total = 0;
    const int tie_before = block_exclusive_scan(tie, warp_sums, tie_total);
    const int take = valid && (key > prefix || (tie && ties_seen + tie_before < krem));
    int take_total = 0;
    const int pos = block_exclusive_scan(take, warp_sums, take_total);
    if (take) out[written + pos] = i >= n_vis ? -1 : static_cast<int32_t>(i);
    written += take_total;
    ties_seen += tie_total;
    if (written >= a.k) break;
  }
}

}  // namespace

namespace raw {
cudaError_t topk_sorted(const TopkArgs& a, cudaStream_t s) {
  if (a.rows == 0 || a.k == 0) return cudaSuccess;
  launch_pdl(topk_kernel, static_cast<unsigned>(a.rows), kThreads, 0, s, a);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
