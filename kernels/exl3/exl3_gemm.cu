// Host launcher of the EXL3 linear kernels (planning and validation: src/ops/exl3_gpu.cpp).
#include "exl3/exl3_gemm.h"
#include "exl3/exl3_gemm_inst.cuh"
#include "exl3/exl3_launch.h"

namespace dsv41::exl3::dev {

// x (any dtype) -> x_had = H128(x ⊙ suh) / sqrt(128) in fp16, one warp per (row, 128-block).
__global__ void __launch_bounds__(kThreads) input_transform_kernel(const XSource xs, int k, __half* xh) {
  const int lane = threadIdx.x & 31;
  const int nb = k / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(xs.m) * nb) return;
  const int t = static_cast<int>(item / nb), b = static_cast<int>(item % nb);
  float v[4];
  load4(xs, t, static_cast<int64_t>(b) * 128 + 4 * lane, v);
  __half2* dst = reinterpret_cast<__half2*>(xh + static_cast<size_t>(t) * k + b * 128 + 4 * lane);
  dst[0] = __floats2half2_rn(v[0], v[1]);
  dst[1] = __floats2half2_rn(v[2], v[3]);
}

// ---- x staging -----------------------------------------------------------------------------
// A batched call's matrix `mat`: its x rows and suh (staging kernels run one item per matrix,
// chunk and token). Matrices of another shape, bit width or codebook than the first stop the kernel.
struct StageBatch {
  int batch;
  const cuda::Exl3Matrix* ws;  // device [batch] (batch > 1)
  int64_t x_batch_bytes;
  int k, n, bits, codebook;  // of the first matrix
  __device__ __forceinline__ void select(int mat, XSource& xs) const {
    if (batch <= 1) return;
    const cuda::Exl3Matrix& w = ws[mat];
    if (w.k != k || w.n != n || w.bits != bits || w.codebook != codebook) __trap();
    xs.p = static_cast<const unsigned char*>(xs.p) + mat * x_batch_bytes;
    xs.suh = w.suh;
  }
};

// One warp per (token r < 4, 128-row chunk): x_had (suh, Hadamard) as int8 levels and statistics
// (stage_int8_warp); tokens >= m get zeros.
__global__ void __launch_bounds__(kThreads) stage_int8_kernel(XSource xs, int k, uint32_t* frag, float2* qstats,
                                                             const StageBatch sb) {
  griddep_wait();
  griddep_launch_dependents();
  const int lane = threadIdx.x & 31;
  int item = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int nchunks = k / 128;
  if (item >= 4 * nchunks * sb.batch) return;
  const int mat = item / (4 * nchunks);
  item -= mat * 4 * nchunks;
  sb.select(mat, xs);
  const int chunk = item >> 2, r = item & 3;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (r < xs.m) load4(xs, r, static_cast<int64_t>(chunk) * 128 + 4 * lane, v);
  stage_int8_warp(v, r, chunk, frag + static_cast<size_t>(mat) * (k / 16) * 128, qstats + mat * nchunks * 4);
}

// One warp per (token r < 8, 128-row chunk): x_had in fp16 B fragments (stage_f16_warp); tokens
// >= m get zeros.
__global__ void __launch_bounds__(kThreads) stage_f16_kernel(XSource xs, int k, __half* frag, const StageBatch sb) {
  griddep_wait();
  griddep_launch_dependents();
  const int lane = threadIdx.x & 31;
  int item = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int nchunks = k / 128;
  if (item >= 8 * nchunks * sb.batch) return;
  const int mat = item / (8 * nchunks);
  item -= mat * 8 * nchunks;
  sb.select(mat, xs);
  const int chunk = item >> 3, r = item & 7;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (r < xs.m) load4(xs, r, static_cast<int64_t>(chunk) * 128 + 4 * lane, v);
  stage_f16_warp(v, r, chunk, frag + static_cast<size_t>(mat) * (k / 16) * 128);
}

template <int K, int CB>
__global__ void __launch_bounds__(kThreads) reconstruct_kernel(const cuda::Exl3Matrix w, uint16_t* out) {
  const int lane = threadIdx.x & 31;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int ntn = w.n / 16;
  if (tile >= static_cast<int64_t>(w.k / 16) * ntn) return;
  const int tk = static_cast<int>(tile / ntn), tn = static_cast<int>(tile % ntn);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(w.trellis + tile * 16 * K);
  int idx[3], off;
  lane_window<K>(lane, idx, off);
  uint32_t st[8];
  tile_states<K>(words, idx, off, st);
  const uint32_t v[4] = {decode_pair<CB>(st[0], st[1]), decode_pair<CB>(st[2], st[3]),
                         decode_pair<CB>(st[4], st[5]), decode_pair<CB>(st[6], st[7])};
  // EXL3.md §2.4: positions i = 0..3 are rows r0, r0+1, r0+8, r0+9 of column c; 4..7 of column c+8.
  const int r0 = 2 * (lane & 3), c = lane >> 2;
  const int rows[4] = {r0, r0 + 1, r0 + 8, r0 + 9};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint16_t h = static_cast<uint16_t>(v[i / 2] >> (16 * (i & 1)));
    const int row = rows[i & 3], col = c + (i >= 4 ? 8 : 0);
    out[(static_cast<int64_t>(tk) * 16 + row) * w.n + tn * 16 + col] = h;
  }
}

}  // namespace dsv41::exl3::dev

namespace dsv41::exl3::cuda {
namespace {

using dev::GemmKernelFn;
using dev::StreamKernelFn;

struct Tables {
  dev::KernelTable t[8];
  Tables() {
    dev::gemm_table_k1(t[0]);
    dev::gemm_table_k2(t[1]);
    dev::gemm_table_k3(t[2]);
    dev::gemm_table_k4(t[3]);
    dev::gemm_table_k5(t[4]);
    dev::gemm_table_k6(t[5]);
    dev::gemm_table_k7(t[6]);
    dev::gemm_table_k8(t[7]);
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace
}  // namespace dsv41::exl3::cuda

namespace dsv41::exl3::dev {
const KernelTable& kernel_table(int bits) { return cuda::tables().t[bits - 1]; }
}  // namespace dsv41::exl3::dev

namespace dsv41::exl3::cuda {
namespace {

StreamKernelFn stream_fn(const Exl3Matrix& w, GemmPath path) {
  const dev::KernelTable& t = tables().t[w.bits - 1];
  if (path == GemmPath::Int8) return w.codebook == 2 ? t.int8 : nullptr;
  return t.f16[w.codebook];
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

size_t xfrag_bytes(const Exl3Matrix& w, GemmPath path) {
  return path == GemmPath::Int8 ? static_cast<size_t>(w.k) * 32 : static_cast<size_t>(w.k) * 16;
}

}  // namespace

size_t gemm_smem_bytes(const Exl3Matrix& w, GemmPath path) {
  if (path == GemmPath::Large) return dev::large_smem_bytes(w.bits);
  return dev::stream_smem_bytes(w.bits, path == GemmPath::Int8);
}

int stream_blocks_per_sm(const Exl3Matrix& w, GemmPath path) {
  StreamKernelFn fn = stream_fn(w, path);
  if (!fn) return 0;
  return resident_blocks_per_sm(fn, dev::stream_smem_bytes(w.bits, path == GemmPath::Int8), dev::kThreads);
}

size_t gemm_workspace_bytes(const Exl3Matrix& w, int64_t m, const GemmPlan& plan) {
  size_t bytes = kCounterBytes;
  if (plan.path == GemmPath::Large) {
    const size_t m_pad = static_cast<size_t>(plan.m_blocks) * kLargeRows;
    bytes += align256(static_cast<size_t>(m) * w.k * 2);
    if (plan.splits > 1) bytes += align256(static_cast<size_t>(plan.splits) * m_pad * w.n * 4);
    return bytes;
  }
  bytes += align256(xfrag_bytes(w, plan.path) * plan.batch);
  if (plan.path == GemmPath::Int8) bytes += align256(static_cast<size_t>(w.k / 128) * 4 * 8 * plan.batch);
  bytes += align256(static_cast<size_t>(plan.grid) * 2 * 8 * 128 * 4);
  return bytes;
}

cudaError_t launch_gemm(const GemmParams& p, const GemmPlan& plan, cudaStream_t stream) {
  const dev::XSource xs{p.x, static_cast<int>(p.x_type), 0, static_cast<int>(p.m), p.x_stride, p.x_cols, p.w.suh};
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  int* counters = reinterpret_cast<int*>(ws);
  size_t off = kCounterBytes;

  if (plan.path != GemmPath::Large) {
    StreamKernelFn fn = stream_fn(p.w, plan.path);
    if (!fn) return cudaErrorInvalidValue;
    dev::StreamArgs a{};
    a.w = p.w;
    a.xfrag = ws + off;
    off += align256(xfrag_bytes(p.w, plan.path) * plan.batch);
    if (plan.path == GemmPath::Int8) {
      a.qstats = reinterpret_cast<const float2*>(ws + off);
      off += align256(static_cast<size_t>(p.w.k / 128) * 4 * 8 * plan.batch);
    }
    a.part = reinterpret_cast<float*>(ws + off);
    a.counters = counters;
    a.y = p.y;
    a.y_type = static_cast<int>(p.y_type);
    a.y_cols = p.y_cols;
    a.y_stride = p.y_stride;
    a.m = static_cast<int>(p.m);
    a.round_bf16 = p.round_bf16;
    a.units_per_group = p.w.k / 128;
    a.batch = plan.batch;
    a.ws = p.batch_w;
    a.xfrag_batch_bytes = xfrag_bytes(p.w, plan.path);
    a.y_batch_stride = p.y_batch_stride;
    const int64_t x_elem = p.x_type == ActType::F32 ? 4 : 2;
    const dev::StageBatch sb{plan.batch, p.batch_w, p.x_batch_stride * x_elem, p.w.k, p.w.n, p.w.bits, p.w.codebook};
    const size_t smem = dev::stream_smem_bytes(p.w.bits, plan.path == GemmPath::Int8);
    cudaError_t e = raise_smem_once(fn, smem);
    if (e != cudaSuccess) return e;
    const int nchunks = p.w.k / 128;
    if (plan.path == GemmPath::Int8) {
      const unsigned blocks = static_cast<unsigned>((4 * nchunks * plan.batch + dev::kWarps - 1) / dev::kWarps);
      e = launch_pdl(dev::stage_int8_kernel, dim3(blocks), dev::kThreads, 0, stream, xs, p.w.k,
                     static_cast<uint32_t*>(const_cast<void*>(a.xfrag)), const_cast<float2*>(a.qstats), sb);
    } else {
      const unsigned blocks = static_cast<unsigned>((8 * nchunks * plan.batch + dev::kWarps - 1) / dev::kWarps);
      e = launch_pdl(dev::stage_f16_kernel, dim3(blocks), dev::kThreads, 0, stream, xs, p.w.k,
                     static_cast<__half*>(const_cast<void*>(a.xfrag)), sb);
    }
    if (e != cudaSuccess) return e;
    return launch_pdl(fn, dim3(plan.grid), dev::kThreads, smem, stream, a);
  }

  GemmKernelFn fn = tables().t[p.w.bits - 1].large[p.w.codebook];
  dev::GemmArgs a{};
  a.w = p.w;
  a.y = p.y;
  a.y_type = static_cast<int>(p.y_type);
  a.y_cols = p.y_cols;
  a.y_stride = p.y_stride;
  a.m = static_cast<int>(p.m);
  a.round_bf16 = p.round_bf16;
  a.m_pad = plan.m_blocks * kLargeRows;
  a.splits = plan.splits;
  a.kt_per_split = plan.kt_per_split;
  a.counters = counters;
  a.xh = reinterpret_cast<const __half*>(ws + off);
  off += align256(static_cast<size_t>(p.m) * p.w.k * 2);
  a.part = plan.splits > 1 ? reinterpret_cast<float*>(ws + off) : nullptr;
  const size_t smem = dev::large_smem_bytes(p.w.bits);
  cudaError_t e = raise_smem_once(fn, smem);
  if (e != cudaSuccess) return e;
  const int64_t items = p.m * (p.w.k / 128);
  const unsigned blocks = static_cast<unsigned>((items + dev::kWarps - 1) / dev::kWarps);
  dev::input_transform_kernel<<<blocks, dev::kThreads, 0, stream>>>(xs, p.w.k, const_cast<__half*>(a.xh));
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 grid(plan.m_blocks, p.w.n / 128, plan.splits);
  fn<<<grid, dev::kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_reconstruct(const Exl3Matrix& w, uint16_t* w_hat, cudaStream_t stream) {
  const int64_t tiles = static_cast<int64_t>(w.k / 16) * (w.n / 16);
  const unsigned blocks = static_cast<unsigned>((tiles + dev::kWarps - 1) / dev::kWarps);
#define DSV41_RECON(KK)                                                                                   \
  case KK:                                                                                                \
    if (w.codebook == 0) dev::reconstruct_kernel<KK, 0><<<blocks, dev::kThreads, 0, stream>>>(w, w_hat);  \
    else if (w.codebook == 1) dev::reconstruct_kernel<KK, 1><<<blocks, dev::kThreads, 0, stream>>>(w, w_hat); \
    else dev::reconstruct_kernel<KK, 2><<<blocks, dev::kThreads, 0, stream>>>(w, w_hat);                  \
    break;
  switch (w.bits) {
    DSV41_RECON(1)
    DSV41_RECON(2)
    DSV41_RECON(3)
    DSV41_RECON(4)
    DSV41_RECON(5)
    DSV41_RECON(6)
    DSV41_RECON(7)
    DSV41_RECON(8)
    default: return cudaErrorInvalidValue;
  }
#undef DSV41_RECON
  return cudaGetLastError();
}

}  // namespace dsv41::exl3::cuda
