// Dense LinBF16 / LinF32 (MODEL.md §4) at decode sizes, bit-identical to the CPU reference (dot.h:
// per output, fma chains over 256-wide K blocks from zero, the block results added in K order from
// zero; bf16 rounding at the end if asked).
//
// Why a kernel of its own: at m = 1..4 these calls are pure weight reads (the compressor's fp32
// 512x5120 pair, weights_proj, the index keys), and the fixed arithmetic order only serialises
// within one (output, 256-block) chain. So the parallelism is (output, block) chains; a call that
// fits one wave of CTAs loads all its weights at once, under the previous kernel's tail.
//
// Layout: a tile is `ro` consecutive weight rows of one group, all of K, for R activation rows. A
// CTA walks a contiguous range of tiles; it issues every 16-byte piece of the next `stages` tiles
// with cp.async (coalesced: consecutive threads take consecutive pieces of a row) BEFORE waiting for
// the previous kernel (no kernel writes weights, so with programmatic dependent launch the weight
// stream starts under the previous kernel's tail), then stages its activation rows (fp32) once per
// (row tile, group). Each thread then runs whole chains: chain c of a tile is (row o = c % ro, block
// kb = c / ro), so a warp covers a few rows x several blocks; it reads its block's weights as 16-byte
// pieces from shared memory and runs the sequential fma chain for all R activation rows at once.
// The tile's block results meet in shared memory, and one thread per (row, activation row) adds
// them in K order from zero and stores. Stages > 1: the next tiles load while this one computes.
//
// Known limit (measured on H200): a chain step costs far more than its fma latency (128 bf16 rows
// of 512 take ~6 us at m = 1 and ~12 us at m = 4, where the R chains of a thread should overlap).
// The likely cause is the `r < nr` guard around each activation row's loads and fmas, which keeps
// the compiler from hoisting the shared-memory loads of later pieces; reading all R staged rows
// unguarded (rows past nr hold stale values whose results are never stored) would remove it. Until
// that is measured, the automatic plan keeps to one-wave calls (make_plan).
//
// Shared-memory swizzles (16-byte piece granularity, inside one 256-block so a piece never leaves
// its block): weight piece j of chain (o, kb) sits at j ^ ((o + kb) & 7): the 32 lanes of a warp
// read 32 different pieces spread evenly over the eight 16-byte bank groups; activation piece j of
// block kb sits at j ^ (kb & 7): a warp's lanes read at most a few distinct pieces (one per block
// it covers), each in its own bank group.

#include <algorithm>
#include <atomic>

#include "ops/cp_async.cuh"
#include "ops/dense_stream.h"
#include "ops/env_setting.h"
#include "ops/ops_common.cuh"
#include "ops/pdl.cuh"

namespace dsv41::ops::gpu {
namespace {

using raw::DenseStreamPlan;

constexpr int kMinThreads = 128, kMaxThreads = 512;
constexpr int kMaxStages = 4;
constexpr int kMaxAutoRows = 8;  // rows per tile the automatic plan starts from (the most measured)
constexpr int kKBlock = static_cast<int>(dev::kGemmKBlock);
constexpr int kXPieces = kKBlock / 4;  // 16-byte activation pieces per block (fp32)

// Device-side shape of a launch (the host plan's tile counts).
struct StreamTiles {
  int ro = 1, stages = 1;
  int64_t otiles = 1, tiles = 1;
};

using dev::cp_async16;
using dev::cp_async_commit;
// Waits until at most n of this thread's committed groups are pending (n < kMaxStages).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  switch (n) {
    case 0: dev::cp_async_wait<0>(); break;
    case 1: dev::cp_async_wait<1>(); break;
    case 2: dev::cp_async_wait<2>(); break;
    default: dev::cp_async_wait<3>(); break;
  }
}

template <class W, int R>
__global__ void __launch_bounds__(kMaxThreads) dense_stream_kernel(DenseArgs a, StreamTiles p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kPieces = kKBlock * static_cast<int>(sizeof(W)) / 16;  // 16-byte weight pieces per block
  const int tid = threadIdx.x, nt = blockDim.x;
  const int ro = p.ro, S = p.stages;
  const int in = static_cast<int>(a.in);
  const int nb = (in + kKBlock - 1) / kKBlock, rs = nb * kKBlock;
  const int cpr = in * static_cast<int>(sizeof(W)) / 16;  // weight pieces per row (in * sizeof(W) % 16 == 0)
  const int tile_pieces = ro * nb * kPieces;
  uint4* wbuf = reinterpret_cast<uint4*>(smem);                 // [S][ro][nb][kPieces]
  float4* xs = reinterpret_cast<float4*>(wbuf + S * tile_pieces);  // [R][nb][kXPieces]
  float* part = reinterpret_cast<float*>(xs + R * (rs / 4));      // [ro][R][nb]
  const int64_t t_begin = static_cast<int64_t>(blockIdx.x) * p.tiles / gridDim.x;
  const int64_t n_tiles = (static_cast<int64_t>(blockIdx.x) + 1) * p.tiles / gridDim.x - t_begin;

  // tile t: group g, activation row tile rt, first weight row o0; returns its weight rows
  auto tile_at = [&](int64_t t, int64_t& g, int64_t& rt, int64_t& o0) -> int {
    const int64_t ot = t % p.otiles, rest = t / p.otiles;
    g = rest % a.groups;
    rt = rest / a.groups;
    o0 = ot * ro;
    return static_cast<int>(a.out - o0 < ro ? a.out - o0 : ro);
  };
  // every weight piece of tile t into buffer buf (thread tid takes pieces tid, tid + nt, ...,
  // walking (row, piece) without divisions)
  const int step_rows = nt / cpr, step_q = nt - step_rows * cpr;
  const int row_first = tid / cpr, q_first = tid - row_first * cpr;
  auto issue = [&](int64_t t, int buf) {
    int64_t g, rt, o0;
    const int nro = tile_at(t, g, rt, o0);
    const unsigned char* src = static_cast<const unsigned char*>(a.w) + (g * a.out + o0) * a.in * static_cast<int64_t>(sizeof(W));
    uint4* dst = wbuf + buf * tile_pieces;
    for (int row = row_first, q = q_first; row < nro;) {
      const int kb = q / kPieces, j = q % kPieces;
      cp_async16(dst + (row * nb + kb) * kPieces + (j ^ ((row + kb) & 7)), src + (static_cast<int64_t>(row) * cpr + q) * 16);
      row += step_rows;
      q += step_q;
      if (q >= cpr) {
        q -= cpr;
        ++row;
      }
    }
  };
  // the nr activation rows of row tile rt, group g (plain loads, several in flight per thread)
  auto stage_x = [&](int64_t rt, int64_t g, int nr) {
    const int cpx = in / 4, total = nr * cpx;
    constexpr int kBatch = 8;
    for (int base = tid; base < total; base += kBatch * nt) {
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * nt;
        if (i < total) {
          const int r = i / cpx, q = i - r * cpx;
          v[u] = *reinterpret_cast<const float4*>(a.x + (rt * R + r) * a.x_stride + g * a.in + static_cast<int64_t>(q) * 4);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * nt;
        if (i < total) {
          const int r = i / cpx, q = i - r * cpx, kb = q / kXPieces, j = q % kXPieces;
          xs[r * (rs / 4) + kb * kXPieces + (j ^ (kb & 7))] = v[u];
        }
      }
    }
  };
  // every (row, block) chain of the tile in buffer buf, for the nr activation rows: dot.h's fma
  // chain from zero in K order; the block results go to part
  auto run_chains = [&](int buf, int nro, int nr) {
    const uint4* wt = wbuf + buf * tile_pieces;
    for (int c = tid; c < nro * nb; c += nt) {
      const int kb = c / nro, o = c - kb * nro;
      const int wkey = (o + kb) & 7, xkey = kb & 7;
      const int nv = min(kPieces, cpr - kb * kPieces);  // pieces of a partial last block
      const uint4* wc = wt + (o * nb + kb) * kPieces;
      const float4* xc = xs + kb * kXPieces;
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll 4
      for (int j = 0; j < nv; ++j) {
        const uint4 wv = wc[j ^ wkey];
        if constexpr (sizeof(W) == 2) {
          float w[8];
          dev::widen8(wv, w, static_cast<const W*>(nullptr));  // bf16 or fp16
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r < nr) {
              const float4 x0 = xc[r * (rs / 4) + ((2 * j) ^ xkey)], x1 = xc[r * (rs / 4) + ((2 * j + 1) ^ xkey)];
              acc[r] = fmaf(x0.x, w[0], acc[r]);
              acc[r] = fmaf(x0.y, w[1], acc[r]);
              acc[r] = fmaf(x0.z, w[2], acc[r]);
              acc[r] = fmaf(x0.w, w[3], acc[r]);
              acc[r] = fmaf(x1.x, w[4], acc[r]);
              acc[r] = fmaf(x1.y, w[5], acc[r]);
              acc[r] = fmaf(x1.z, w[6], acc[r]);
              acc[r] = fmaf(x1.w, w[7], acc[r]);
            }
          }
        } else {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r < nr) {
              const float4 x = xc[r * (rs / 4) + (j ^ xkey)];
              acc[r] = fmaf(x.x, __uint_as_float(wv.x), acc[r]);
              acc[r] = fmaf(x.y, __uint_as_float(wv.y), acc[r]);
              acc[r] = fmaf(x.z, __uint_as_float(wv.z), acc[r]);
              acc[r] = fmaf(x.w, __uint_as_float(wv.w), acc[r]);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < nr) part[(o * R + r) * nb + kb] = acc[r];
    }
  };

  // the first `stages` tiles (every group committed, empty or not: group i is tile i)
  for (int s = 0; s < S; ++s) {
    if (s < n_tiles) issue(t_begin + s, s);
    cp_async_commit();
  }
  dev::pdl_enter();
  int64_t staged = -1;  // (row tile, group) whose activation rows are in xs
  for (int64_t i = 0; i < n_tiles; ++i) {
    int64_t g, rt, o0;
    const int nro = tile_at(t_begin + i, g, rt, o0);
    const int nr = static_cast<int>(a.m - rt * R < R ? a.m - rt * R : R);
    // xs is free: the previous tile's chains finished before the barrier after them
    if (rt * a.groups + g != staged) {
      stage_x(rt, g, nr);
      staged = rt * a.groups + g;
    }
    cp_async_wait_pending(S - 1);  // tile i's group (the S - 1 later ones may still fly)
    __syncthreads();
    const int buf = static_cast<int>(i % S);
    run_chains(buf, nro, nr);
    __syncthreads();  // buffer buf and part are complete; buf may be refilled
    if (i + S < n_tiles) issue(t_begin + i + S, buf);
    cp_async_commit();
    // block results added in K order from zero, one thread per (weight row, activation row)
    for (int k = tid; k < nro * nr; k += nt) {
      const int o = k / nr, r = k - o * nr;
      const float total = dev::ordered_sum(0.0f, part + (o * R + r) * nb, nb);
      a.y[(rt * R + r) * a.y_stride + g * a.out + o0 + o] = a.round_bf16 ? dev::bf16_round(total) : total;
    }
  }
}

// ---- host: plan and launch --------------------------------------------------------------------------
EnvSetting g_mode{"DSV41_DENSE_STREAM", 0, 0, 2};
EnvSetting g_rows{"DSV41_DENSE_STREAM_ROWS", 0, 0, 64};
EnvSetting g_stages{"DSV41_DENSE_STREAM_STAGES", 0, 0, kMaxStages};
EnvSetting g_ctas_per_sm{"DSV41_DENSE_STREAM_CTAS_PER_SM", 0, 0, 16};

int act_rows_for(int64_t m) { return m == 1 ? 1 : m == 2 ? 2 : 4; }

size_t stream_smem(int64_t in, size_t esize, int ro, int stages, int R) {
  const int64_t nb = (in + kKBlock - 1) / kKBlock, rs = nb * kKBlock;
  return static_cast<size_t>(stages * ro * rs) * esize + static_cast<size_t>(R * rs + ro * R * nb) * sizeof(float);
}

// Registers per thread of one kernel variant (read once; bounds the CTAs per SM). The first call
// may come inside a graph capture: the query runs in the relaxed capture mode (it enqueues nothing).
template <class W, int R>
int kernel_regs() {
  static const int regs = [] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const bool swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    cudaFuncAttributes f{};
    const cudaError_t e = cudaFuncGetAttributes(&f, dense_stream_kernel<W, R>);
    if (swapped) cudaThreadExchangeStreamCaptureMode(&mode);
    return e == cudaSuccess && f.numRegs > 0 ? f.numRegs : 128;
  }();
  return regs;
}
template <class W>
int kernel_regs_for(int R) {
  return R == 1 ? kernel_regs<W, 1>() : R == 2 ? kernel_regs<W, 2>() : kernel_regs<W, 4>();
}
int kernel_regs_for(DenseType wt, int R) {
  if (wt == DenseType::BF16) return kernel_regs_for<uint16_t>(R);
  if (wt == DenseType::F16) return kernel_regs_for<__half>(R);
  return kernel_regs_for<float>(R);
}

// The current device's SMs, shared memory per CTA (opt-in) and per SM, and registers per SM; read
// once per device.
struct DeviceLimits {
  int sms = 0, regs_sm = 0;
  size_t smem_block = 0, smem_sm = 0;
};
DeviceLimits device_limits() {
  static DeviceLimits cache[64];
  static std::atomic<bool> known[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  const int slot = dev & 63;
  if (known[slot].load(std::memory_order_acquire)) return cache[slot];
  DeviceLimits d;
  int block = 0, sm = 0, regs = 0;
  d.sms = sm_count();
  block = static_cast<int>(smem_per_block_limit());  // GB10: 99 KB (ops/smem_limit.h)
  if (block <= 0) block = 48 * 1024;
  if (cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) sm = block;
  if (cudaDeviceGetAttribute(&regs, cudaDevAttrMaxRegistersPerMultiprocessor, dev) != cudaSuccess) regs = 65536;
  d.smem_block = static_cast<size_t>(block);
  d.smem_sm = static_cast<size_t>(sm);
  d.regs_sm = regs;
  cache[slot] = d;
  known[slot].store(true, std::memory_order_release);
  return d;
}

// The automatic plan takes a call only when one wave holds it: one tile per CTA, every CTA resident
// at once, with the most rows per tile (8, 4, 2, 1) whose shared memory fits. Measured on H200
// (bench_gpu_linear --dense sweep, every plan below checked bit for bit): in one wave more rows per
// tile were never slower (compressor 512 fp32 rows of 5120, m = 1 / 2: 8 rows 5.9 / 10.4 us, 4 rows
// 7.2 / 13.0 us, 1 row 8.5 / 19.1 us; weights_proj and the index keys alike), while calls too big
// for one wave (wo_a 8x1024x4096, the head) ran slower streamed (several tiles per CTA, 2-4 stages)
// than on the older tiled kernel at every plan tried (wo_a m = 1 / 4: 32-54 / 89-300 us against 28
// / 44 us): the per-thread fma chain, not the weight stream, bounds a streamed tile. Forced
// settings (tests, benches) may pick any rows per tile, stages and CTAs per SM that fit.
bool make_plan(const DenseArgs& a, DenseStreamPlan* out) {
  const size_t esize = a.wt == DenseType::F32 ? 4 : 2;
  if (a.m <= 0 || a.in <= 0 || a.out <= 0 || a.groups <= 0 || a.in > (int64_t{1} << 20)) return false;
  if ((a.in * static_cast<int64_t>(esize)) % 16 != 0 || a.in % 4 != 0 || a.x_stride % 4 != 0) return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
  const DeviceLimits d = device_limits();
  const size_t limit = std::min(d.smem_block, d.smem_sm > 1024 ? d.smem_sm - 1024 : 0);
  const int R = act_rows_for(a.m), regs = kernel_regs_for(a.wt, R);
  const int64_t nb = (a.in + kKBlock - 1) / kKBlock;
  const int64_t row_tiles = (a.m + R - 1) / R;
  const int f_rows = static_cast<int>(g_rows.get()), f_stages = static_cast<int>(g_stages.get());
  const int f_cps = static_cast<int>(g_ctas_per_sm.get());
  const bool forced = f_rows || f_stages || f_cps;
  const int S = f_stages ? f_stages : 1;
  for (int ro = f_rows ? f_rows : kMaxAutoRows; ro >= 1; ro /= 2) {
    if (!f_rows && ro > 1 && (ro / 2 >= a.out || ro * nb > kMaxThreads)) continue;
    const int threads = static_cast<int>(std::clamp<int64_t>((ro * nb + 31) / 32 * 32, kMinThreads, kMaxThreads));
    const size_t smem = stream_smem(a.in, esize, ro, S, R);
    int64_t per_sm = std::min<int64_t>({static_cast<int64_t>(d.smem_sm / (smem + 1024)), 2048 / threads,
                                        d.regs_sm / (threads * regs)});
    if (f_cps) per_sm = std::min<int64_t>(per_sm, f_cps);
    const int64_t otiles = (a.out + ro - 1) / ro, tiles = otiles * a.groups * row_tiles;
    const int64_t ctas = std::min<int64_t>(tiles, d.sms * per_sm);
    const bool fits = smem <= limit && per_sm >= 1;
    if (fits && (forced || ctas == tiles)) {
      *out = DenseStreamPlan{ro, S, R, threads, tiles, ctas, smem};
      return true;
    }
    if (f_rows) break;
  }
  return false;
}

template <class W, int R>
cudaError_t launch_plan(const DenseArgs& a, const DenseStreamPlan& p, cudaStream_t st) {
  const DeviceLimits d = device_limits();
  const cudaError_t e = allow_dynamic_smem<dense_stream_kernel<W, R>>(std::min(d.smem_block, d.smem_sm - 1024));
  if (e != cudaSuccess) return e;
  StreamTiles t;
  t.ro = p.rows_per_tile;
  t.stages = p.stages;
  t.otiles = (a.out + p.rows_per_tile - 1) / p.rows_per_tile;
  t.tiles = p.tiles;
  return launch_pdl(dense_stream_kernel<W, R>, dim3(static_cast<unsigned>(p.ctas)), dim3(p.threads), p.smem, st, a, t);
}

template <class W>
cudaError_t launch_stream(const DenseArgs& a, const DenseStreamPlan& p, cudaStream_t st) {
  if (p.act_rows == 1) return launch_plan<W, 1>(a, p, st);
  if (p.act_rows == 2) return launch_plan<W, 2>(a, p, st);
  return launch_plan<W, 4>(a, p, st);
}

}  // namespace

namespace raw {
bool dense_stream_plan(const DenseArgs& a, DenseStreamPlan* plan) {
  DenseStreamPlan p;
  if (!make_plan(a, &p)) return false;
  if (plan) *plan = p;
  return true;
}

bool dense_stream_takes(const DenseArgs& a) {
  const int64_t mode = g_mode.get();
  if (mode == 1 || (mode == 0 && a.m > kDenseStreamMaxRows)) return false;
  return dense_stream_plan(a, nullptr);
}

cudaError_t dense_stream(const DenseArgs& a, cudaStream_t s) {
  if (a.m <= 0) return cudaSuccess;
  DenseStreamPlan p;
  if (!make_plan(a, &p)) return cudaErrorInvalidValue;
  if (a.wt == DenseType::BF16) return launch_stream<uint16_t>(a, p, s);
  if (a.wt == DenseType::F16) return launch_stream<__half>(a, p, s);
  return launch_stream<float>(a, p, s);
}

int set_dense_stream_mode(int mode) { return static_cast<int>(g_mode.set(mode)); }
int set_dense_stream_rows_per_tile(int rows) { return static_cast<int>(g_rows.set(rows)); }
int set_dense_stream_stages(int stages) { return static_cast<int>(g_stages.set(stages)); }
int set_dense_stream_ctas_per_sm(int ctas) { return static_cast<int>(g_ctas_per_sm.set(ctas)); }
}  // namespace raw

}  // namespace dsv41::ops::gpu
