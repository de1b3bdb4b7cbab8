// Row gather (ops/gather_rows.h): a block per destination row; 16-byte copies where both rows and
// the width allow them.
#include <cmath>

#include "ops/gather_rows.h"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) gather_rows_kernel(GatherRowsArgs a, bool vec4) {
  dev::pdl_wait();
  dev::pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int32_t i = a.idx[r];
  float* d = a.dst + r * a.dst_stride;
  if (i < 0 || i >= a.src_rows) {  // no row; past the end: the host validated them, a bug made visible
    const float v = i < 0 ? 0.0f : NAN;
    for (int64_t c = threadIdx.x; c < a.cols; c += kThreads) d[c] = v;
    return;
  }
  const float* s = a.src + static_cast<int64_t>(i) * a.src_stride;
  if (vec4) {
    const int64_t n4 = a.cols / 4;
    for (int64_t c = threadIdx.x; c < n4; c += kThreads)
      reinterpret_cast<float4*>(d)[c] = reinterpret_cast<const float4*>(s)[c];
  } else {
    for (int64_t c = threadIdx.x; c < a.cols; c += kThreads) d[c] = s[c];
  }
}

}  // namespace

namespace raw {
cudaError_t gather_rows(const GatherRowsArgs& a, cudaStream_t s) {
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const bool vec4 = a.cols % 4 == 0 && a.src_stride % 4 == 0 && a.dst_stride % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(a.src) % 16 == 0 && reinterpret_cast<uintptr_t>(a.dst) % 16 == 0;
  launch_pdl(gather_rows_kernel, static_cast<unsigned>(a.rows), kThreads, 0, s, a, vec4);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
