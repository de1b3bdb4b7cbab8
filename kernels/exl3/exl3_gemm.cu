// Host launcher of the EXL3 linear kernels (planning and validation: src/ops/exl3_gpu.cpp).
#include "exl3/exl3_gemm.h"
#include "exl3/exl3_gemm_inst.cuh"

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

// Stages x once per k-split for the small paths (instead of once per block): int8 fragments
// [k/16][32] uint4 with per-split statistics, or fp16 rows [8][k]. One block per split.
template <bool INT8>
__global__ void __launch_bounds__(kThreads) stage_kernel(const XSource xs, int k, int kt_per_split, void* out,
                                                         int4* stats) {
  extern __shared__ __align__(16) unsigned char smem[];  // int8: hbuf [4][rows] fp32
  __shared__ uint32_t s_amax[4];
  __shared__ int s_hi[4], s_lo[4];
  const int split = blockIdx.x;
  const int kt0 = split * kt_per_split, kt1 = min(k / 16, kt0 + kt_per_split);
  unsigned char* xout = INT8 ? reinterpret_cast<unsigned char*>(static_cast<uint4*>(out) + static_cast<size_t>(kt0) * 32)
                             : reinterpret_cast<unsigned char*>(static_cast<__half*>(out) + static_cast<size_t>(kt0) * 16);
  stage_x<INT8>(xs, kt0, kt1, xout, k, reinterpret_cast<float*>(smem), s_amax, s_hi, s_lo);
  if (INT8 && threadIdx.x < 4)
    stats[split * 4 + threadIdx.x] = make_int4(static_cast<int>(s_amax[threadIdx.x]), s_hi[threadIdx.x], s_lo[threadIdx.x], 0);
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

struct Tables {
  GemmKernelFn t[8][3][3];
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

int path_code(GemmPath p) {
  switch (p) {
    case GemmPath::F16: return dev::kPathF16;
    case GemmPath::Int8: return dev::kPathInt8;
    default: return dev::kPathLarge;
  }
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

}  // namespace

size_t gemm_smem_bytes(const Exl3Matrix& w, GemmPath path, int rows_per_block) {
  if (path == GemmPath::Large) return dev::large_smem_bytes(w.bits);
  return dev::small_smem_bytes(w.bits, path == GemmPath::Int8, rows_per_block);
}

size_t gemm_workspace_bytes(const Exl3Matrix& w, int64_t m, const GemmPlan& plan) {
  size_t bytes = kCounterBytes;
  const int tokb = plan.path == GemmPath::Large ? kLargeRows : (plan.path == GemmPath::Int8 ? 4 : 8);
  const size_t m_pad = static_cast<size_t>(plan.m_blocks) * tokb;
  if (plan.path == GemmPath::Large) bytes += align256(static_cast<size_t>(m) * w.k * 2);
  if (plan.path == GemmPath::Int8) bytes += align256(static_cast<size_t>(w.k) * 32) + align256(plan.splits * 64);
  if (plan.path == GemmPath::F16) bytes += align256(static_cast<size_t>(8) * w.k * 2);
  if (plan.splits > 1) bytes += align256(static_cast<size_t>(plan.splits) * m_pad * w.n * 4);
  return bytes;
}

cudaError_t launch_gemm(const GemmParams& p, const GemmPlan& plan, cudaStream_t stream) {
  const int path = path_code(plan.path);
  GemmKernelFn fn = tables().t[p.w.bits - 1][path][p.w.codebook];
  if (!fn) return cudaErrorInvalidValue;
  const int tokb = plan.path == GemmPath::Large ? kLargeRows : (plan.path == GemmPath::Int8 ? 4 : 8);

  dev::GemmArgs a{};
  a.w = p.w;
  a.xs = dev::XSource{p.x, static_cast<int>(p.x_type), 0, static_cast<int>(p.m), p.x_stride, p.x_cols,
                      p.w.suh};
  a.y = p.y;
  a.y_type = static_cast<int>(p.y_type);
  a.y_cols = p.y_cols;
  a.y_stride = p.y_stride;
  a.m = static_cast<int>(p.m);
  a.m_pad = plan.m_blocks * tokb;
  a.splits = plan.splits;
  a.kt_per_split = plan.kt_per_split;
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  a.counters = reinterpret_cast<int*>(ws);
  size_t off = kCounterBytes;
  if (plan.path == GemmPath::Large) {
    a.xh = reinterpret_cast<const __half*>(ws + off);
    off += align256(static_cast<size_t>(p.m) * p.w.k * 2);
  }
  a.xstage = nullptr;
  a.xstats = nullptr;
  if (plan.path == GemmPath::Int8) {
    a.xstage = ws + off;
    off += align256(static_cast<size_t>(p.w.k) * 32);
    a.xstats = reinterpret_cast<const int4*>(ws + off);
    off += align256(plan.splits * 64);
  } else if (plan.path == GemmPath::F16) {
    a.xstage = ws + off;
    off += align256(static_cast<size_t>(8) * p.w.k * 2);
  }
  a.part = plan.splits > 1 ? reinterpret_cast<float*>(ws + off) : nullptr;

  const size_t smem = gemm_smem_bytes(p.w, plan.path, plan.kt_per_split * 16);
  // Raise the dynamic shared-memory limit to the largest this kernel can ask for, once.
  static bool raised[8][3][3] = {};
  bool& r = raised[p.w.bits - 1][path][p.w.codebook];
  if (!r) {
    const size_t cap = gemm_smem_bytes(p.w, plan.path, kMaxSmallRows);
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(cap));
    if (e != cudaSuccess) return e;
    r = true;
  }
  if (plan.path == GemmPath::Large) {
    const int64_t items = p.m * (p.w.k / 128);
    const unsigned blocks = static_cast<unsigned>((items + dev::kWarps - 1) / dev::kWarps);
    dev::input_transform_kernel<<<blocks, dev::kThreads, 0, stream>>>(a.xs, p.w.k, const_cast<__half*>(a.xh));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (plan.path == GemmPath::Int8) {
    const size_t hsmem = static_cast<size_t>(4) * plan.kt_per_split * 16 * 4;
    dev::stage_kernel<true><<<plan.splits, dev::kThreads, hsmem, stream>>>(
        a.xs, p.w.k, plan.kt_per_split, const_cast<void*>(a.xstage), const_cast<int4*>(a.xstats));
  } else if (plan.path == GemmPath::F16) {
    dev::stage_kernel<false><<<plan.splits, dev::kThreads, 0, stream>>>(a.xs, p.w.k, plan.kt_per_split,
                                                                         const_cast<void*>(a.xstage), nullptr);
  }
  if (plan.path != GemmPath::Large) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
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
