// Attention index lists and the staged window of a chunk (MODEL.md §5.4 "Window list"): the list
// layouts of the CPU reference (decode ring order; prefill position order) followed by the
// indexer's top-k, encoded for sparse_attention's two row pools.
#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

__global__ void attn_lists_kernel(AttnListArgs a) {
  dev::pdl_enter();
  const int64_t len = a.win_len + a.topk_len, total = a.n * len;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / len, j = idx % len;
    const int64_t p = a.positions ? a.positions[t] : a.start + t;
    int32_t e;
    if (j < a.win_len) {
      if (a.decode) {
        const int64_t slot = (p % a.win + 1 + j) % a.win;
        e = slot > p ? -1 : static_cast<int32_t>(slot);
      } else {
        const int64_t first = p - a.win + 1 > 0 ? p - a.win + 1 : 0, pos = first + j;
        e = pos > p ? -1 : static_cast<int32_t>(pos - a.pos_base);
      }
    } else {
      const int32_t c = a.topk[t * a.topk_len + (j - a.win_len)];
      e = (c < 0 || c >= a.n_entries) ? -1 : static_cast<int32_t>(c + a.split);
    }
    a.list[idx] = e;
  }
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < a.n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (a.pool_a) a.pool_a[t] = a.pool_a_value;
    if (a.pool_b) a.pool_b[t] = a.pool_b_value;
  }
}

__global__ void stage_window_kernel(StageWindowArgs a, int64_t pos_base) {
  dev::pdl_enter();
  const int64_t rows = a.start - pos_base + a.n, total = rows * a.d;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / a.d, c = idx % a.d, pos = pos_base + r;
    a.out[idx] = pos < a.start ? a.ring[(pos % a.win) * a.d + c] : a.kv[(pos - a.start) * a.d + c];
  }
}

unsigned elem_grid(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

namespace raw {
cudaError_t attn_lists(const AttnListArgs& a, cudaStream_t s) {
  if (a.n == 0 || (a.win_len + a.topk_len == 0 && !a.pool_a && !a.pool_b)) return cudaSuccess;
  const int64_t total = a.n * (a.win_len + a.topk_len);
  launch_pdl(attn_lists_kernel, elem_grid(total > a.n ? total : a.n), 256, 0, s, a);
  return cudaGetLastError();
}
cudaError_t stage_window(const StageWindowArgs& a, cudaStream_t s) {
  const int64_t pos_base = a.start - a.win + 1 > 0 ? a.start - a.win + 1 : 0;
  const int64_t total = (a.start - pos_base + a.n) * a.d;
  if (total == 0) return cudaSuccess;
  launch_pdl(stage_window_kernel, elem_grid(total), 256, 0, s, a, pos_base);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
