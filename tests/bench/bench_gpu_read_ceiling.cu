// What a decode GEMV's weight read can reach: HBM read bandwidth at the sizes and access patterns of
// the decode linears, with nothing else in the way.
//
// The decode target is stated against the copy ceiling (4.3 TB/s on the H200), measured on long
// copies. A decode linear reads 6-42 MB once, cold, in one launch, and the GEMV kernels read it as
// 16-row tiles: each warp takes a few 16-byte pieces of each of its 16 rows per step, the K range
// split over the warps of a tile (kernels/ops/lin_fp8.cu, lin8_tc_gemv.cu). This benchmark reads the
// same bytes with the loads alone (an XOR of every word, nothing computed), so the time it reports
// is what any kernel with that read pattern can at best achieve:
//   stream       every warp load 512 contiguous bytes, each CTA a contiguous span (the best case);
//   tile S/D/W   a warp owns 16 rows and reads S contiguous bytes of each per step, D steps in flight
//                (S/64 16-byte pieces a lane for rows g and g + 8, lane g = lane / 4), the tile's
//                K split over W warps segment by segment (warp w takes segments w, w + W, ...);
//   rows B/ST/L    the dense tiled GEMV's pattern (kernels/ops/lin_dense.cu, the head): a CTA of 128
//                threads owns 128 rows and stages B bytes of each per step in shared memory by
//                cp.async, ST stages (ST - 1 in flight while one is consumed); L = row-major reads
//                B bytes of 128 rows a step (the layout the head has), L = tiled the same bytes
//                laid out so that a step's 128 x B bytes are contiguous;
//   wring B/ST/V the same rows with one ring a warp: each warp owns 32 rows and stages B bytes of
//                each per step through its own ST-stage ring (cp.async, waited by the warp alone,
//                no CTA barrier), V warps a CTA;
//   launch       an empty kernel, back to back (the per-call cost no read can avoid).
// Every case rotates over regions of a 2 GiB buffer (> 10x the L2), so each call reads HBM. The
// XOR of all words read is checked against the stream kernel's for the same region: a pattern that
// skipped or repeated a piece fails the run (exit 1).
//
// Usage: bench_gpu_read_ceiling
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr double kCopyGBs = 4300.0;
constexpr size_t kBuffer = size_t{2} << 30;
constexpr int kThreads = 256, kWarps = kThreads / 32;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Word i of the buffer is a hash of i, so a misplaced or repeated read changes the XOR.
__global__ void fill_kernel(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u + static_cast<uint32_t>(i >> 32);
    x ^= x >> 15;
    x *= 0x85EBCA6Bu;
    p[i] = x ^ (x >> 13);
  }
}

__device__ __forceinline__ void xor_out(uint32_t acc, uint32_t* out) {
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(out, acc);
}

// Each CTA reads `span` contiguous bytes (a multiple of kThreads * 16 * D), D loads a thread in flight.
template <int D>
__global__ void __launch_bounds__(kThreads) stream_kernel(const uint4* base, size_t bytes, size_t span, uint32_t* out) {
  const size_t begin = blockIdx.x * span, end = begin + span < bytes ? begin + span : bytes;
  uint32_t acc = 0;
  for (size_t off = begin + threadIdx.x * size_t{16}; off < end; off += size_t{kThreads} * 16 * D) {
    uint4 v[D];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const size_t o = off + static_cast<size_t>(d) * kThreads * 16;
      v[d] = o < end ? ld_nc(base + o / 16) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) acc ^= fold(v[d]);
  }
  xor_out(acc, out);
}

// A [rows][k] byte matrix as 16-row tiles; W warps a tile (CTA = 8 / W tiles); P pieces of 16 bytes
// a lane and row per step (S = 64 P bytes of a row), D steps in flight.
template <int P, int D>
__global__ void __launch_bounds__(kThreads) tile_kernel(const uint8_t* base, int64_t rows, int64_t k, int W,
                                                        uint32_t* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (kWarps / W) + warp / W;
  const int wsub = warp % W;
  constexpr int S = 64 * P;
  uint32_t acc = 0;
  if (tile * 16 < rows) {
    const uint8_t* r0 = base + (tile * 16 + g) * k + 16 * t;
    const uint8_t* r8 = r0 + 8 * k;
    const int64_t segs = k / S;
    for (int64_t j = wsub; j < segs; j += int64_t{W} * D) {
      uint4 v[D][2 * P];
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int64_t s = j + int64_t{d} * W;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const bool ok = s < segs;
          v[d][2 * p] = ok ? ld_nc(reinterpret_cast<const uint4*>(r0 + s * S + 64 * p)) : make_uint4(0, 0, 0, 0);
          v[d][2 * p + 1] = ok ? ld_nc(reinterpret_cast<const uint4*>(r8 + s * S + 64 * p)) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int d = 0; d < D; ++d)
#pragma unroll
        for (int p = 0; p < 2 * P; ++p) acc ^= fold(v[d][p]);
    }
  }
  xor_out(acc, out);
}

// The dense tiled GEMV's staging (see the header): region = [rows][k] bytes, rows % 128 == 0,
// k % B == 0; Tiled reads it as [rows / 128][k / B][128][B].
constexpr int kRowThreads = 128;
template <int B, int ST, bool Tiled>
__global__ void __launch_bounds__(kRowThreads) rows_kernel(const uint8_t* base, int64_t k, uint32_t* out) {
  extern __shared__ __align__(16) uint8_t stage_buf[];
  constexpr int kChunks = B / 16;
  const int t = threadIdx.x;
  const int64_t tile = blockIdx.x, steps = k / B;
  auto issue = [&](int64_t q, int buf) {
    for (int c = t; c < kRowThreads * kChunks; c += kRowThreads) {
      const int row = c / kChunks, ch = c % kChunks;
      const uint8_t* src = Tiled ? base + ((tile * steps + q) * kRowThreads + row) * B + ch * 16
                                 : base + (tile * kRowThreads + row) * k + q * B + ch * 16;
      const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(stage_buf + (buf * kRowThreads + row) * B + ch * 16));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    }
  };
  uint32_t acc = 0;
#pragma unroll
  for (int q = 0; q < ST - 1; ++q) {
    if (q < steps) issue(q, q);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int64_t q = 0; q < steps; ++q) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
    __syncthreads();
    const int64_t qn = q + ST - 1;
    if (qn < steps) issue(qn, static_cast<int>(qn % ST));
    asm volatile("cp.async.commit_group;\n" ::);
    const uint4* row = reinterpret_cast<const uint4*>(stage_buf + (static_cast<int>(q % ST) * kRowThreads + t) * B);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc ^= fold(row[c]);
  }
  xor_out(acc, out);
}

// One ring a warp: warp w of CTA b owns rows [(b V + w) 32, + 32).
template <int B, int ST, int V>
__global__ void __launch_bounds__(V * 32) wring_kernel(const uint8_t* base, int64_t rows, int64_t k, uint32_t* out) {
  extern __shared__ __align__(16) uint8_t ring_buf[];
  constexpr int kChunks = B / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * V + warp) * 32, steps = k / B;
  uint8_t* ring = ring_buf + warp * ST * 32 * B;
  uint32_t acc = 0;
  if (row0 < rows) {
    auto issue = [&](int64_t q) {
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = lane + 32 * i, row = c / kChunks, ch = c % kChunks;
        const uint8_t* src = base + (row0 + row) * k + q * B + ch * 16;
        const unsigned d =
            static_cast<unsigned>(__cvta_generic_to_shared(ring + (static_cast<int>(q % ST) * 32 + row) * B + ch * 16));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
      }
    };
#pragma unroll
    for (int q = 0; q < ST - 1; ++q) {
      if (q < steps) issue(q);
      asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int64_t q = 0; q < steps; ++q) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
      __syncwarp();
      const uint4* r = reinterpret_cast<const uint4*>(ring + (static_cast<int>(q % ST) * 32 + lane) * B);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) acc ^= fold(r[c]);
      __syncwarp();
      if (q + ST - 1 < steps) issue(q + ST - 1);
      asm volatile("cp.async.commit_group;\n" ::);
    }
  }
  xor_out(acc, out);
}

__global__ void empty_kernel() {}

struct Shape {
  const char* name;
  int64_t rows, k;  // bytes of a row
};

int g_sms = 0;
uint8_t* g_buf = nullptr;
uint32_t* g_xor = nullptr;  // one word per call of a timed loop
constexpr int kIters = 60;

// Region i of the rotation: consecutive regions of the buffer, 4 KB aligned.
size_t region_stride(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
int regions(size_t bytes) { return static_cast<int>(kBuffer / region_stride(bytes)); }

template <class F>
double time_calls(F call) {
  for (int i = 0; i < 3; ++i) call(i);
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < kIters; ++i) call(i);
  cudaEventRecord(b);
  check(cudaEventSynchronize(b), "timed calls");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / kIters;
}

void report(const std::string& what, const Shape& s, double us) {
  const double bytes = static_cast<double>(s.rows) * s.k;
  const double gbs = bytes / (us * 1e3);
  std::printf("%-22s %-24s %8.2f MB %8.2f us/call %8.1f GB/s %5.1f %% of copy\n", what.c_str(), s.name, bytes / 1e6, us,
              gbs, 100.0 * gbs / kCopyGBs);
  std::fflush(stdout);
}

// XORs of calls 0 .. n-1 (each a different region) as the stream kernel computes them.
std::vector<uint32_t> read_xors(int n) {
  std::vector<uint32_t> h(n);
  check(cudaMemcpy(h.data(), g_xor, sizeof(uint32_t) * n, cudaMemcpyDeviceToHost), "xor download");
  return h;
}

template <int D>
void launch_stream(const Shape& s, int i, uint32_t* out) {
  const size_t bytes = static_cast<size_t>(s.rows) * s.k;
  const uint8_t* p = g_buf + (i % regions(bytes)) * region_stride(bytes);
  const size_t unit = size_t{kThreads} * 16 * D;
  // about four CTAs an SM, each a whole number of load rounds
  const size_t want = static_cast<size_t>(g_sms) * 4;
  const size_t span = ((bytes + want - 1) / want + unit - 1) / unit * unit;
  const unsigned ctas = static_cast<unsigned>((bytes + span - 1) / span);
  stream_kernel<D><<<ctas, kThreads>>>(reinterpret_cast<const uint4*>(p), bytes, span, out);
}

// Runs `call` once on each region of `want`, checks each call's XOR against the stream kernel's
// (a pattern that skipped or repeated a piece fails), then times it and reports it as `label`.
template <class F>
bool check_then_time(const std::string& label, const Shape& s, const std::vector<uint32_t>& want, F call) {
  check(cudaMemset(g_xor, 0, sizeof(uint32_t) * kIters), "xor clear");
  for (int i = 0; i < static_cast<int>(want.size()); ++i) call(i);
  check(cudaGetLastError(), label.c_str());
  const std::vector<uint32_t> got = read_xors(static_cast<int>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      std::fprintf(stderr, "%s on %s: XOR of region %zu is %08x, the stream kernel's %08x\n", label.c_str(), s.name, i,
                   got[i], want[i]);
      return false;
    }
  report(label, s, time_calls(call));
  return true;
}

// The cold region of call i.
const uint8_t* region(const Shape& s, int i) {
  const size_t bytes = static_cast<size_t>(s.rows) * s.k;
  return g_buf + (i % regions(bytes)) * region_stride(bytes);
}

template <int P, int D>
bool run_tile(const Shape& s, int W, const std::vector<uint32_t>& want) {
  if (s.k % (64 * P) != 0 || s.rows % 16 != 0) return true;
  const int64_t tiles = s.rows / 16;
  const int per_cta = kWarps / W;
  const unsigned ctas = static_cast<unsigned>((tiles + per_cta - 1) / per_cta);
  return check_then_time("tile S=" + std::to_string(64 * P) + " D=" + std::to_string(D) + " W=" + std::to_string(W), s,
                         want, [&](int i) { tile_kernel<P, D><<<ctas, kThreads>>>(region(s, i), s.rows, s.k, W, g_xor + i % kIters); });
}

template <int B, int ST, bool Tiled>
bool run_rows(const Shape& s, const std::vector<uint32_t>& want) {
  if (s.k % B != 0 || s.rows % kRowThreads != 0) return true;
  const size_t smem = size_t{ST} * kRowThreads * B;
  check(cudaFuncSetAttribute(rows_kernel<B, ST, Tiled>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "rows kernel shared memory");
  const unsigned ctas = static_cast<unsigned>(s.rows / kRowThreads);
  return check_then_time(
      std::string("rows B=") + std::to_string(B) + " ST=" + std::to_string(ST) + (Tiled ? " tiled" : " row-major"), s, want,
      [&](int i) { rows_kernel<B, ST, Tiled><<<ctas, kRowThreads, smem>>>(region(s, i), s.k, g_xor + i % kIters); });
}

template <int B, int ST, int V>
bool run_wring(const Shape& s, const std::vector<uint32_t>& want) {
  if (s.k % B != 0 || s.rows % 32 != 0) return true;
  const size_t smem = size_t{V} * ST * 32 * B;
  check(cudaFuncSetAttribute(wring_kernel<B, ST, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "wring kernel shared memory");
  const unsigned ctas = static_cast<unsigned>((s.rows / 32 + V - 1) / V);
  return check_then_time("wring B=" + std::to_string(B) + " ST=" + std::to_string(ST) + " V=" + std::to_string(V), s, want,
                         [&](int i) { wring_kernel<B, ST, V><<<ctas, V * 32, smem>>>(region(s, i), s.rows, s.k, g_xor + i % kIters); });
}

// W for a shape as the decode kernels pick it: enough warps for about two waves of 16 an SM.
int launcher_w(const Shape& s) {
  const int64_t tiles = s.rows / 16, want = int64_t{g_sms} * 32;
  int W = 1;
  while (W < kWarps && tiles * W < want) W *= 2;
  return W;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "no CUDA device");
  g_sms = prop.multiProcessorCount;
  check(cudaMalloc(&g_buf, kBuffer), "buffer");
  check(cudaMalloc(&g_xor, sizeof(uint32_t) * kIters), "xor words");
  fill_kernel<<<g_sms * 8, kThreads>>>(reinterpret_cast<uint32_t*>(g_buf), kBuffer / 4);
  check(cudaDeviceSynchronize(), "fill");
  std::printf("%s, %d SMs, L2 %.0f MB; every call reads a cold region of a 2 GiB buffer\n", prop.name, g_sms,
              prop.l2CacheSize / 1e6);

  const double launch_us = time_calls([](int) { empty_kernel<<<g_sms, kThreads>>>(); });
  std::printf("%-22s %57.2f us/call\n", "launch (empty kernel)", launch_us);

  // Rows x bytes of a row of the decode linears (configs/deepseek-v4.1-flash.json): FP8 codes are a
  // byte a weight, FP4 half; the expert bank is 6 experts' gate and up rows.
  const Shape shapes[] = {
      {"wq_a 1280x5120", 1280, 5120},          {"shared w1 2304x5120", 2304, 5120},
      {"shared w2 5120x2304", 5120, 2304},     {"wq_b 32768x1280", 32768, 1280},
      {"wo_b 5120x8192", 5120, 8192},          {"fp4 gate/up 6x2x2304x2560", 6 * 2 * 2304, 2560},
      {"fp4 down 6x5120x1152", 6 * 5120, 1152}, {"wo_a bf16 8x1024x8192", 8 * 1024, 8192},
      {"head bf16 129280x10240", 129280, 10240},
  };
  bool ok = true;
  for (const Shape& s : shapes) {
    const size_t bytes = static_cast<size_t>(s.rows) * s.k;
    const int n = std::min(kIters, regions(bytes));
    check(cudaMemset(g_xor, 0, sizeof(uint32_t) * kIters), "xor clear");
    for (int i = 0; i < n; ++i) launch_stream<4>(s, i, g_xor + i);
    const std::vector<uint32_t> want = read_xors(n);
    report("stream D=4", s, time_calls([&](int i) { launch_stream<4>(s, i, g_xor + i % kIters); }));
    report("stream D=8", s, time_calls([&](int i) { launch_stream<8>(s, i, g_xor + i % kIters); }));
    if (s.rows % kRowThreads == 0 && s.k >= 4096) {  // the dense tiled GEMV's pattern (head, wo_b-wide rows)
      ok = run_rows<128, 3, false>(s, want) && ok;
      ok = run_rows<128, 3, true>(s, want) && ok;
      ok = run_rows<128, 4, false>(s, want) && ok;
      ok = run_rows<128, 6, false>(s, want) && ok;
      ok = run_rows<64, 4, false>(s, want) && ok;
      ok = run_rows<64, 6, false>(s, want) && ok;
      ok = run_rows<64, 8, false>(s, want) && ok;
      ok = run_rows<256, 3, false>(s, want) && ok;
      ok = run_rows<256, 4, false>(s, want) && ok;
      ok = run_wring<128, 3, 4>(s, want) && ok;
      ok = run_wring<128, 4, 4>(s, want) && ok;
      ok = run_wring<128, 6, 2>(s, want) && ok;
      ok = run_wring<128, 8, 1>(s, want) && ok;
      ok = run_wring<128, 4, 1>(s, want) && ok;
      ok = run_wring<256, 3, 4>(s, want) && ok;
      ok = run_wring<256, 4, 2>(s, want) && ok;
      ok = run_wring<64, 8, 4>(s, want) && ok;
      ok = run_wring<512, 2, 4>(s, want) && ok;
      ok = run_wring<512, 3, 2>(s, want) && ok;
    }
    if (s.rows > 100000) continue;  // the head: stream and rows only
    const int W = launcher_w(s);
    const std::vector<int> splits = W == 1 ? std::vector<int>{1} : std::vector<int>{1, W};
    for (int w : splits) {
      ok = run_tile<1, 4>(s, w, want) && ok;
      ok = run_tile<1, 8>(s, w, want) && ok;
      ok = run_tile<2, 4>(s, w, want) && ok;
      ok = run_tile<4, 2>(s, w, want) && ok;
      ok = run_tile<4, 4>(s, w, want) && ok;
      ok = run_tile<8, 1>(s, w, want) && ok;
      ok = run_tile<8, 2>(s, w, want) && ok;
    }
  }
  cudaFree(g_buf);
  cudaFree(g_xor);
  return ok ? 0 : 1;
}
