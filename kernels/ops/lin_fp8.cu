// Lin8 / Lin4 (MODEL.md §4): the activation arrives quantised (ActQuant8 codes + scales); each
// 32-wide K block's code dot is summed sequentially in fp32 (products of e4m3 x e4m3/e2m1 codes are
// exact, so fmaf(x, w, part) equals the reference's part + x*w), scaled by act_scale·w_scale and the
// block terms are added in increasing K order from zero — the CPU reference's order, so outputs are
// bit-identical.
//
// Layout (decode bandwidth): a warp owns NO output rows per lane slot and R activation rows. Its
// lanes split one K chunk of `kw` blocks (kw = 32, 16 or 8, chosen to divide the block count) and
// 32/kw slots of outputs; lane (slot, kbl) loads block kbl of its NO rows with 16-byte coalesced
// loads (the blocks of up to 8/NO chunks at once, so ~8 blocks are in flight per lane), decodes the
// activation block once and reuses it for all NO outputs, and keeps the R x NO block dots in
// registers. The chunk's block terms go through a per-warp shared buffer and each
// (row, output) pair is folded by one lane in K order. Codes are decoded through lane-replicated
// shared tables (entry b of lane l at word 32·b + l: 32 lanes never share a bank).
//
// Rows sharing a weight: Lin8 takes R <= 4 activation rows per weight read; Lin4 groups the
// (token, slot) pairs that picked the same expert (in row order, up to R per group), so an expert is
// read once per group instead of once per pair.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTableWords = 256 * 32;  // one lane-replicated 256-entry table

enum class Fmt : int { Fp8 = 0, Fp4 = 1 };

// The kernel's view of a Lin8 or a Lin4 call.
struct BlockScaledArgs {
  const uint8_t* w = nullptr;   // Fp8: codes [out][in]; Fp4: packed [E][out][in/2]
  const uint8_t* ws = nullptr;  // Fp8: [ceil(out/32)][ceil(in/32)]; Fp4: [E][out][in/32]
  int64_t in = 0, out = 0, n_experts = 1;
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  int64_t rows = 0;                     // Fp8: m; Fp4: pairs
  const int32_t* expert_ids = nullptr;  // Fp4 only
  int64_t x_row_div = 1;                // Fp4 only
  float* y = nullptr;
  int64_t y_stride = 0;
  bool round_bf16 = true;
  int kw = 32;              // K blocks per chunk (lanes per output slot)
  int64_t row_base = 0;     // Fp4: first pair row of this launch slice
  int64_t out_tiles = 0;    // output tiles of kWarps * NO * (32/kw) rows
};

__device__ __forceinline__ uint32_t bf16_bits_of(float v) { return static_cast<uint32_t>(dev::f32_to_bf16_bits(v)); }

// Fills the lane-replicated tables: e4m3 values (always), e2m1 code pairs as two bf16 (Fp4).
template <Fmt F>
__device__ void fill_tables(float* e4m3_tab, uint32_t* e2m1_tab, uint32_t* scratch) {
  const int t = threadIdx.x;
  // kThreads == 256: one entry per thread
  scratch[t] = __float_as_uint(dev::e4m3_value(static_cast<uint8_t>(t)));
  if constexpr (F == Fmt::Fp4) {
    const uint32_t lo = bf16_bits_of(dev::e2m1_value(static_cast<uint8_t>(t & 0xF)));
    const uint32_t hi = bf16_bits_of(dev::e2m1_value(static_cast<uint8_t>(t >> 4)));
    scratch[256 + t] = lo | (hi << 16);
  }
  __syncthreads();
  // replicate: word i of a table holds entry i/32; four consecutive words per 16-byte store
  for (int i = t * 4; i < kTableWords; i += kThreads * 4) {
    const uint32_t v = scratch[i >> 5];
    reinterpret_cast<uint4*>(e4m3_tab)[i >> 2] = make_uint4(v, v, v, v);
    if constexpr (F == Fmt::Fp4) {
      const uint32_t p = scratch[256 + (i >> 5)];
      reinterpret_cast<uint4*>(e2m1_tab)[i >> 2] = make_uint4(p, p, p, p);
    }
  }
  __syncthreads();
}

template <int N>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
}

// Per-CTA description of the activation rows it serves: up to R rows that share one weight.
template <int R>
struct RowGroup {
  int nr;               // rows in use (1..R)
  int64_t y_row[R];     // output rows
  int64_t x_row[R];     // activation rows
  int64_t expert;       // Fp4 bank index
};

template <Fmt F, int R, int NO>
__global__ void __launch_bounds__(kThreads, 2) block_scaled_kernel(BlockScaledArgs a) {
  extern __shared__ __align__(16) uint32_t smem[];
  float* e4m3_tab = reinterpret_cast<float*>(smem);
  uint32_t* e2m1_tab = smem + kTableWords;
  float* fold_buf = reinterpret_cast<float*>(smem + (F == Fmt::Fp4 ? 2 : 1) * kTableWords);
  __shared__ int s_count;
  __shared__ int64_t s_members[R];
  __shared__ int s_nr;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kw = a.kw, ns = 32 / kw, slot = lane / kw, kbl = lane % kw;
  const int64_t in = a.in, nb = in / 32;
  const int64_t tile_rows = static_cast<int64_t>(kWarps) * NO * ns;

  RowGroup<R> grp;
  if constexpr (F == Fmt::Fp8) {
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * R;
    grp.nr = static_cast<int>(a.rows - r0 < R ? a.rows - r0 : R);
#pragma unroll
    for (int r = 0; r < R; ++r) grp.y_row[r] = grp.x_row[r] = r0 + (r < grp.nr ? r : 0);
    grp.expert = 0;
  } else {
    const int64_t row = a.row_base + blockIdx.y;
    const int64_t e = a.expert_ids ? a.expert_ids[row] : 0;
    if (e < 0 || e >= a.n_experts) {  // an empty slot: zeros in this CTA's tiles
      for (int64_t t = blockIdx.x; t < a.out_tiles; t += gridDim.x)
        for (int64_t i = tid; i < tile_rows; i += kThreads) {
          const int64_t o = t * tile_rows + i;
          if (o < a.out) a.y[row * a.y_stride + o] = 0.0f;
        }
      return;
    }
    // The pairs of expert e in row order form groups of R; only a group's first row runs it.
    if constexpr (R == 1) {
      if (tid == 0) s_nr = 1, s_members[0] = row;
    } else if (a.expert_ids == nullptr) {
      if (row % R != 0) return;
      const int nr = static_cast<int>(a.rows - row < R ? a.rows - row : R);
      if (tid == 0) {
        s_nr = nr;
        for (int r = 0; r < R; ++r) s_members[r] = row + (r < nr ? r : 0);
      }
    } else {
      if (tid == 0) s_count = 0;
      __syncthreads();
      int before = 0;
      for (int64_t i = tid; i < row; i += kThreads) before += a.expert_ids[i] == e;
      if (before) atomicAdd(&s_count, before);
      __syncthreads();
      if (s_count % R != 0) return;  // uniform: every thread read the same count
      if (warp == 0) {
        int found = 1;
        int64_t mem[R];
#pragma unroll
        for (int r = 0; r < R; ++r) mem[r] = row;
        for (int64_t base = row + 1; base < a.rows && found < R; base += 32) {
          const int64_t i = base + lane;
          unsigned mask = __ballot_sync(dev::kFull, i < a.rows && a.expert_ids[i] == e);
          while (mask && found < R) {
            const int b = __ffs(mask) - 1;
            mask &= mask - 1;
#pragma unroll
            for (int r = 1; r < R; ++r)
              if (r == found) mem[r] = base + b;
            ++found;
          }
        }
        if (lane == 0) {
          s_nr = found;
          for (int r = 0; r < R; ++r) s_members[r] = mem[r];
        }
      }
    }
    __syncthreads();
    grp.nr = s_nr;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      grp.y_row[r] = s_members[r];
      grp.x_row[r] = s_members[r] / a.x_row_div;
    }
    grp.expert = e;
  }

  fill_tables<F>(e4m3_tab, e2m1_tab, reinterpret_cast<uint32_t*>(fold_buf));
  const float* my_e4m3 = e4m3_tab + lane;
  const uint32_t* my_e2m1 = e2m1_tab + lane;
  // this warp's fold buffer: pair p = (r*ns + slot)*NO + j, kw terms (+1 pad: odd stride)
  float* fb = fold_buf + warp * (R * NO * 32 + R * NO * 4);
  const int fstride = kw + 1;
  const int pairs = grp.nr * ns * NO;
  constexpr int kFold = (R * NO * 4 + 31) / 32;  // pairs per lane at most (ns <= 4)
  constexpr int kWW = F == Fmt::Fp8 ? 8 : 4;      // 32-bit words per weight block
  // chunks whose weights are loaded together: ~8 blocks per lane (fewer where registers run short)
  constexpr int kBlocksInFlight = (R == 4 || (F == Fmt::Fp8 && R == 2)) ? 4 : 8;
  constexpr int kCU = kBlocksInFlight / NO > 1 ? kBlocksInFlight / NO : 1;

  const int64_t snb = (in + 31) / 32;
  const int64_t n_chunks = (nb + kw - 1) / kw;
  const uint8_t* wbase = F == Fmt::Fp8 ? a.w : a.w + grp.expert * a.out * (in / 2);
  const uint8_t* sbase = F == Fmt::Fp8 ? a.ws : a.ws + grp.expert * a.out * nb;

  for (int64_t tile = blockIdx.x; tile < a.out_tiles; tile += gridDim.x) {
    const int64_t o_warp = tile * tile_rows + static_cast<int64_t>(warp) * NO * ns;
    const int64_t o_lane = o_warp + static_cast<int64_t>(slot) * NO;
    float acc[kFold];
#pragma unroll
    for (int q = 0; q < kFold; ++q) acc[q] = 0.0f;
    if (o_warp < a.out) {
      for (int64_t c0 = 0; c0 < n_chunks; c0 += kCU) {
        // weights of kCU chunks x NO rows, issued together (16-byte loads, coalesced over the kw
        // lanes of a slot): ~8 blocks in flight per lane whatever NO is
        uint32_t wq[kCU][NO][kWW];
        float wsv[kCU][NO];
#pragma unroll
        for (int u = 0; u < kCU; ++u) {
          const int64_t kb = (c0 + u) * kw + kbl;
#pragma unroll
          for (int j = 0; j < NO; ++j) {
            const int64_t o = o_lane + j;
            if (c0 + u < n_chunks && kb < nb && o < a.out) {
              if constexpr (F == Fmt::Fp8) {
                load_words(wbase + o * in + kb * 32, wq[u][j]);
                wsv[u][j] = dev::e8m0_value(sbase[(o / 32) * snb + kb]);
              } else {
                load_words(wbase + o * (in / 2) + kb * 16, wq[u][j]);
                wsv[u][j] = dev::e8m0_value(sbase[o * nb + kb]);
              }
            } else {
#pragma unroll
              for (int i = 0; i < kWW; ++i) wq[u][j][i] = 0;
              wsv[u][j] = 0.0f;
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kCU; ++u) {
          const int64_t c = c0 + u;
          if (c >= n_chunks) break;  // uniform over the warp
          const int64_t kb = c * kw + kbl;
          const bool kb_ok = kb < nb;
          const int cnt = static_cast<int>(nb - c * kw < kw ? nb - c * kw : kw);
          float term[R][NO];
          if (kb_ok) {
            // activation codes of the R rows
            uint32_t xq[R][8];
            float xsv[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if (r < grp.nr) {
                load_words(a.x_codes + grp.x_row[r] * in + kb * 32, xq[r]);
                xsv[r] = a.x_scales[grp.x_row[r] * nb + kb];
              } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) xq[r][i] = 0;
                xsv[r] = 0.0f;
              }
            }
            float part[R][NO];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < NO; ++j) part[r][j] = 0.0f;
            // the block dot, element by element in K order for every (row, output)
#pragma unroll
            for (int i = 0; i < 32; i += 2) {
              float xv0[R], xv1[R];
#pragma unroll
              for (int r = 0; r < R; ++r) {
                const uint32_t word = xq[r][i >> 2];
                xv0[r] = my_e4m3[((word >> (8 * (i & 3))) & 0xFF) << 5];
                xv1[r] = my_e4m3[((word >> (8 * ((i + 1) & 3))) & 0xFF) << 5];
              }
#pragma unroll
              for (int j = 0; j < NO; ++j) {
                float w0, w1;
                if constexpr (F == Fmt::Fp8) {
                  const uint32_t word = wq[u][j][i >> 2];
                  w0 = my_e4m3[((word >> (8 * (i & 3))) & 0xFF) << 5];
                  w1 = my_e4m3[((word >> (8 * ((i + 1) & 3))) & 0xFF) << 5];
                } else {
                  const uint32_t word = wq[u][j][i >> 3];
                  const uint32_t pr = my_e2m1[((word >> (8 * ((i >> 1) & 3))) & 0xFF) << 5];
                  w0 = __uint_as_float(pr << 16);
                  w1 = __uint_as_float(pr & 0xFFFF0000u);
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                  part[r][j] = fmaf(xv0[r], w0, part[r][j]);
                  part[r][j] = fmaf(xv1[r], w1, part[r][j]);
                }
              }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < NO; ++j) term[r][j] = __fmul_rn(__fmul_rn(part[r][j], xsv[r]), wsv[u][j]);
          } else {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < NO; ++j) term[r][j] = 0.0f;
          }
          // fold the chunk's terms in K order: pair p by lane p % 32
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (r < grp.nr)
#pragma unroll
              for (int j = 0; j < NO; ++j) fb[((r * ns + slot) * NO + j) * fstride + kbl] = term[r][j];
          __syncwarp();
#pragma unroll
          for (int q = 0; q < kFold; ++q) {
            const int p = lane + 32 * q;
            if (p < pairs) {
              const float* src = fb + p * fstride;
              float v = acc[q];
              for (int i = 0; i < cnt; ++i) v = __fadd_rn(v, src[i]);
              acc[q] = v;
            }
          }
          __syncwarp();
        }
      }
    }
    // lane p writes pair p = (r*ns + s)*NO + j
#pragma unroll
    for (int q = 0; q < kFold; ++q) {
      const int p = lane + 32 * q;
      if (p < pairs) {
        const int r = p / (ns * NO), s = (p / NO) % ns, j = p % NO;
        const int64_t o = o_warp + static_cast<int64_t>(s) * NO + j;
        int64_t yr = grp.y_row[0];
#pragma unroll
        for (int rr = 1; rr < R; ++rr)
          if (rr == r) yr = grp.y_row[rr];  // static indices keep the row list in registers
        if (o < a.out) a.y[yr * a.y_stride + o] = a.round_bf16 ? dev::bf16_round(acc[q]) : acc[q];
      }
    }
  }
}

// ---- launch ---------------------------------------------------------------------------------------
int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      n <= 0)
    return 132;
  return n;
}

// Opt-in to more than 48 KB of dynamic shared memory, once per kernel and device (the attribute is
// per device; tensor-parallel processes drive several).
template <class K>
cudaError_t allow_smem(K kernel, size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}
template <Fmt F, int R, int NO>
std::atomic<uint64_t>& configured() {
  static std::atomic<uint64_t> done{0};
  return done;
}

// Blocks per chunk: the largest of 32/16/8 that divides the block count (no idle lanes), else 8.
int pick_kw(int64_t nb) {
  if (nb % 32 == 0) return 32;
  if (nb % 16 == 0) return 16;
  return 8;
}

template <Fmt F, int R, int NO>
size_t smem_bytes() {
  return static_cast<size_t>((F == Fmt::Fp4 ? 2 : 1) * kTableWords) * 4 +
         static_cast<size_t>(kWarps) * (R * NO * 32 + R * NO * 4) * 4;
}

template <Fmt F, int R, int NO>
cudaError_t launch_one(const BlockScaledArgs& a, int64_t groups, cudaStream_t s) {
  const size_t smem = smem_bytes<F, R, NO>();
  const cudaError_t attr = allow_smem(block_scaled_kernel<F, R, NO>, smem, configured<F, R, NO>());
  if (attr != cudaSuccess) return attr;
  BlockScaledArgs b = a;
  const int ns = 32 / b.kw;
  const int64_t tile_rows = static_cast<int64_t>(kWarps) * NO * ns;
  b.out_tiles = (b.out + tile_rows - 1) / tile_rows;
  // resident CTAs per SM by shared memory (227 KB usable); CTAs loop over tiles beyond that
  // (registers: __launch_bounds__ asks for two CTAs per SM, ptxas usually fits three)
  const int per_sm = static_cast<int>(std::clamp<size_t>((227 * 1024) / (smem + 1024), 1, 3));
  const int64_t capacity = static_cast<int64_t>(sm_count()) * per_sm;
  int64_t gx = capacity / (groups > 0 ? groups : 1);
  if (gx < 1) gx = 1;
  if (gx > b.out_tiles) gx = b.out_tiles;
  // grid.y is limited to 65535: row groups run in slices
  for (int64_t g0 = 0; g0 < groups; g0 += 65535) {
    const int64_t ng = groups - g0 < 65535 ? groups - g0 : 65535;
    BlockScaledArgs c = b;
    if constexpr (F == Fmt::Fp4) {
      c.row_base = g0;  // pair rows stay global: a group may reach into the next slice
    } else {
      // slice of m rows: shift the activation, scale and output pointers
      const int64_t r0 = g0 * R;
      c.x_codes = a.x_codes + r0 * a.in;
      c.x_scales = a.x_scales + r0 * (a.in / 32);
      c.y = a.y + r0 * a.y_stride;
      c.rows = a.rows - r0;
    }
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(ng));
    block_scaled_kernel<F, R, NO><<<grid, kThreads, smem, s>>>(c);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Every instantiation's shared-memory opt-in at the first launch on a device (an eager call before
// any graph capture then covers the variants a captured call may pick).
template <Fmt F>
cudaError_t configure_all() {
  cudaError_t e = allow_smem(block_scaled_kernel<F, 1, 8>, smem_bytes<F, 1, 8>(), configured<F, 1, 8>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 1, 4>, smem_bytes<F, 1, 4>(), configured<F, 1, 4>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 1, 2>, smem_bytes<F, 1, 2>(), configured<F, 1, 2>());
  if constexpr (F == Fmt::Fp4)
    if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 2, 8>, smem_bytes<F, 2, 8>(), configured<F, 2, 8>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 2, 4>, smem_bytes<F, 2, 4>(), configured<F, 2, 4>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 2, 2>, smem_bytes<F, 2, 2>(), configured<F, 2, 2>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 4, 4>, smem_bytes<F, 4, 4>(), configured<F, 4, 4>());
  if (e == cudaSuccess) e = allow_smem(block_scaled_kernel<F, 4, 2>, smem_bytes<F, 4, 2>(), configured<F, 4, 2>());
  return e;
}

// R activation rows per weight read; NO outputs per lane, lowered while the grid has few warps.
template <Fmt F>
cudaError_t launch(BlockScaledArgs a, int R, int64_t groups, cudaStream_t s) {
  const cudaError_t conf = configure_all<F>();
  if (conf != cudaSuccess) return conf;
  a.kw = pick_kw(a.in / 32);
  const int ns = 32 / a.kw;
  const int64_t min_warps = 8 * static_cast<int64_t>(sm_count());
  // register budget: the NO weight blocks (8 words FP8, 4 words FP4) and R activation blocks
  int no = (R == 4 || (F == Fmt::Fp8 && R == 2)) ? 4 : 8;
  while (no > 2 && ((a.out + static_cast<int64_t>(no) * ns - 1) / (static_cast<int64_t>(no) * ns)) * groups < min_warps)
    no /= 2;
  if (R == 1) {
    if (no == 8) return launch_one<F, 1, 8>(a, groups, s);
    if (no == 4) return launch_one<F, 1, 4>(a, groups, s);
    return launch_one<F, 1, 2>(a, groups, s);
  }
  if (R == 2) {
    if constexpr (F == Fmt::Fp4)
      if (no == 8) return launch_one<F, 2, 8>(a, groups, s);
    if (no == 4) return launch_one<F, 2, 4>(a, groups, s);
    return launch_one<F, 2, 2>(a, groups, s);
  }
  if (no == 4) return launch_one<F, 4, 4>(a, groups, s);
  return launch_one<F, 4, 2>(a, groups, s);
}

}  // namespace

namespace raw {
cudaError_t lin8(const Lin8Args& a, cudaStream_t s) {
  if (a.m == 0) return cudaSuccess;
  BlockScaledArgs b;
  b.w = a.w.codes;
  b.ws = a.w.scales;
  b.in = a.w.in;
  b.out = a.w.out;
  b.x_codes = a.x_codes;
  b.x_scales = a.x_scales;
  b.rows = a.m;
  b.y = a.y;
  b.y_stride = a.y_stride;
  b.round_bf16 = a.round_bf16;
  const int R = a.m == 1 ? 1 : (a.m == 2 ? 2 : 4);
  return launch<Fmt::Fp8>(b, R, (a.m + R - 1) / R, s);
}
cudaError_t lin4(const Lin4Args& a, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  BlockScaledArgs b;
  b.w = a.w.packed;
  b.ws = a.w.scales;
  b.in = a.w.in;
  b.out = a.w.out;
  b.n_experts = a.w.n_experts;
  b.x_codes = a.x_codes;
  b.x_scales = a.x_scales;
  b.rows = a.rows;
  b.expert_ids = a.expert_ids;
  b.x_row_div = a.x_row_div;
  b.y = a.y;
  b.y_stride = a.y_stride;
  b.round_bf16 = a.round_bf16;
  // Group size: one token's pairs never share an expert; a few tokens rarely do; passes often.
  const int R = a.rows <= 8 ? 1 : (a.rows <= 64 ? 2 : 4);
  return launch<Fmt::Fp4>(b, R, a.rows, s);
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
