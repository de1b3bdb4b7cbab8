// EXL3 kernel benchmark (issue 5): per DeepSeek-V4.1 shape, K = 2..4 and m = 1, 4, 16, 512, the
// time per call measured over CUDA-graph replays of many calls, trellis GB/s and % of the copy
// bandwidth measured in the same run; then a whole MoE decode layer (6 routed + shared expert)
// against its bytes floor. Random trellis (any bit pattern is valid), rotated through enough
// distinct buffers that the 60 MB L2 cannot serve repeated calls.
//
// Usage: bench_exl3 [--quick] [--sweep] [--moe]
//   --quick  K = 3 only
//   --sweep  also time every forced blocks-per-column-group count for m = 1 and 4, and forced k-splits
//            of the MoE layer's kernels (tuning aid)
//   --moe    the MoE layer only (K = 3)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/ops/exl3_gpu.h"

namespace {

using dsv41::ops::ActType;
using dsv41::ops::Exl3Matrix;
using dsv41::ops::GemmPath;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_exl3: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A device pool of random bytes; trellis "instances" are windows into it.
struct Pool {
  uint8_t* p = nullptr;
  size_t bytes = 0;
  explicit Pool(size_t b) : bytes(b) {
    ck(cudaMalloc(&p, b), "pool alloc");
    std::vector<uint64_t> h(b / 8);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (auto& v : h) {  // xorshift64*
      s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
      v = s * 2685821657736338717ull;
    }
    ck(cudaMemcpy(p, h.data(), b, cudaMemcpyHostToDevice), "pool upload");
  }
};

struct Scales {
  uint16_t* d = nullptr;  // fp16 values around +-0.05 .. 1
  explicit Scales(size_t n) {
    std::vector<uint16_t> h(n);
    std::mt19937 rng(5);
    for (auto& v : h) v = static_cast<uint16_t>(((rng() & 1) ? 0xA000 : 0x2000) + (rng() & 0x0FFF));  // +-(0.008..0.016)
    ck(cudaMalloc(&d, n * 2), "scales");
    ck(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), "scales upload");
  }
};

double measure_copy_bw(uint8_t* buf, size_t bytes) {
  // Device-to-device copy of half the buffer into the other half, counting read + write bytes.
  const size_t half = bytes / 2;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) ck(cudaMemcpyAsync(buf + half, buf, half, cudaMemcpyDeviceToDevice), "copy");
  std::vector<float> ts;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < 10; ++i) cudaMemcpyAsync(buf + half, buf, half, cudaMemcpyDeviceToDevice);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return 2.0 * half * 10 / (ts[2] * 1e-3) / 1e9;  // GB/s
}

// Times `body(i)` for i in [0, calls) captured into one graph; returns microseconds per call.
template <class F>
double time_graph(cudaStream_t s, int calls, F&& body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < calls; ++i) body(i);
  ck(cudaStreamEndCapture(s, &g), "end capture");
  ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  for (int i = 0; i < 2; ++i) ck(cudaGraphLaunch(ge, s), "warm-up");
  ck(cudaStreamSynchronize(s), "warm-up sync");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    ck(cudaEventSynchronize(b), "replay");
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2] * 1e3 / calls;
}

struct Bench {
  Pool& pool;
  Scales& scales;
  cudaStream_t s;
  double copy_gbs;
  uint8_t* x = nullptr;
  uint8_t* y = nullptr;
  uint8_t* ws = nullptr;
  size_t ws_bytes = 0;

  Exl3Matrix matrix(int k, int n, int K, size_t instance) const {
    const size_t bytes = static_cast<size_t>(k) * n * K / 8;
    const size_t slots = std::max<size_t>(1, pool.bytes / bytes);
    Exl3Matrix w;
    w.trellis = reinterpret_cast<const uint16_t*>(pool.p + (instance % slots) * bytes);
    w.suh = scales.d;
    w.svh = scales.d;
    w.k = k;
    w.n = n;
    w.bits = K;
    w.codebook = 2;
    return w;
  }

  // Microseconds per call of y = x·W (m rows) over distinct trellis instances.
  double gemm_us(int k, int n, int K, int m, GemmPath path, int splits, int* used_splits = nullptr) {
    const size_t bytes = static_cast<size_t>(k) * n * K / 8;
    const size_t distinct = std::max<size_t>(1, pool.bytes / bytes);
    Exl3Matrix w0 = matrix(k, n, K, 0);
    const auto plan = dsv41::ops::exl3_gemm_plan(w0, m, path, splits);
    if (used_splits) *used_splits = plan.path == GemmPath::Large ? plan.splits : plan.grid;
    if (plan.workspace > ws_bytes) {
      if (ws) cudaFree(ws);
      ws_bytes = plan.workspace;
      ck(cudaMalloc(&ws, ws_bytes), "workspace");
      dsv41::ops::exl3_workspace_init(ws, ws_bytes, s);
    }
    auto call = [&](int i) {
      dsv41::ops::GemmParams p;
      p.w = matrix(k, n, K, static_cast<size_t>(i));
      p.x = x;
      p.x_type = ActType::BF16;
      p.m = m;
      p.x_cols = p.x_stride = k;
      p.y = y;
      p.y_type = ActType::BF16;
      p.y_cols = p.y_stride = n;
      p.workspace = ws;
      p.workspace_bytes = ws_bytes;
      p.path = path;
      p.splits = splits;
      dsv41::ops::exl3_gemm(p, s);
    };
    call(0);  // eager first call: one-time kernel attribute setup stays out of the capture
    ck(cudaStreamSynchronize(s), "first call");
    // Size the graph: enough calls for ~2 ms and to cycle through the distinct buffers.
    const double once = time_graph(s, 2, call);
    int calls = static_cast<int>(std::clamp(2000.0 / std::max(once, 1.0), 3.0, 400.0));
    calls = static_cast<int>(std::min<size_t>(std::max<size_t>(calls, std::min<size_t>(distinct, 64)), 400));
    return time_graph(s, calls, call);
  }
};

const char* path_name(GemmPath p, int m, int cb) {
  if (p == GemmPath::Auto) p = (m <= 4 && cb == 2) ? GemmPath::Int8 : (m <= 8 ? GemmPath::F16 : GemmPath::Large);
  return p == GemmPath::Int8 ? "int8" : (p == GemmPath::F16 ? "f16" : "large");
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false, sweep = false, profile = false, moe_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    else if (!std::strcmp(argv[i], "--profile")) profile = true;
    else if (!std::strcmp(argv[i], "--moe")) moe_only = true;
    else {
      std::fprintf(stderr, "usage: bench_exl3 [--quick] [--sweep] [--profile] [--moe]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "device");
  cudaStream_t s;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Pool pool(size_t{1} << 30);
  Scales scales(1 << 18);
  Bench b{pool, scales, s, 0.0};
  b.copy_gbs = measure_copy_bw(pool.p, pool.bytes);  // pool content is only read by kernels later
  // Refill the half the copy overwrote is unnecessary: the copied bytes are random too.
  ck(cudaMalloc(&b.x, size_t{512} * 8192 * 2), "x");
  {
    std::vector<uint16_t> h(size_t{512} * 8192);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : h) {
      float f = nd(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      v = static_cast<uint16_t>(u >> 16);
    }
    ck(cudaMemcpy(b.x, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "x upload");
  }
  ck(cudaMalloc(&b.y, size_t{512} * 129280 * 2), "y");
  std::printf("device: %s, %d SMs; copy bandwidth (read+write): %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, b.copy_gbs);
  if (profile) {
    // Plain launches for a profiler: 8192->5120 and the head at K = 3, m = 1, int8 and f16 paths.
    for (GemmPath path : {GemmPath::Int8, GemmPath::F16}) {
      for (int rep = 0; rep < 2; ++rep) {
        for (auto [k, n] : {std::pair{8192, 5120}, std::pair{5120, 129280}}) {
          dsv41::ops::GemmParams p;
          p.w = b.matrix(k, n, 3, static_cast<size_t>(rep));
          const auto plan = dsv41::ops::exl3_gemm_plan(p.w, 1, path);
          void* ws;
          ck(cudaMalloc(&ws, plan.workspace), "ws");
          dsv41::ops::exl3_workspace_init(ws, plan.workspace, s);
          p.x = b.x;
          p.x_type = ActType::BF16;
          p.m = 1;
          p.x_cols = p.x_stride = k;
          p.y = b.y;
          p.y_type = ActType::BF16;
          p.y_cols = p.y_stride = n;
          p.workspace = ws;
          p.workspace_bytes = plan.workspace;
          p.path = path;
          dsv41::ops::exl3_gemm(p, s);
          ck(cudaStreamSynchronize(s), "profile call");
          cudaFree(ws);
        }
      }
    }
    return 0;
  }

  struct Shape {
    const char* name;
    int k, n;
  };
  const Shape shapes[] = {{"5120->2304", 5120, 2304},   {"2304->5120", 2304, 5120}, {"5120->1280", 5120, 1280},
                          {"1280->32768", 1280, 32768}, {"8192->5120", 8192, 5120}, {"5120->512", 5120, 512},
                          {"head 5120->129280", 5120, 129280}};
  std::vector<int> Ks = quick || moe_only ? std::vector<int>{3} : std::vector<int>{2, 3, 4};
  // "grid": persistent blocks of the small paths; "splits": k-splits of the large path.
  if (!moe_only) {
    std::printf("\n%-18s %2s %4s %-5s %6s %10s %9s %7s %9s\n", "shape", "K", "m", "path", "grid|splits", "us/call",
                "GB/s", "%copy", "m/m1 time");
    for (const Shape& sh : shapes) {
      for (int K : Ks) {
        double t1 = 0;
        for (int m : {1, 4, 16, 512}) {
          int splits = 0;
          const double us = b.gemm_us(sh.k, sh.n, K, m, GemmPath::Auto, 0, &splits);
          if (m == 1) t1 = us;
          const double gbs = static_cast<double>(sh.k) * sh.n * K / 8 / (us * 1e-6) / 1e9;
          std::printf("%-18s %2d %4d %-5s %6d %10.2f %9.0f %6.1f%% %9.2f\n", sh.name, K, m,
                      path_name(GemmPath::Auto, m, 2), splits, us, gbs, 100.0 * gbs / b.copy_gbs, us / t1);
        }
        // The exact-decode fp16 path at m = 1, for comparison with the int8 path.
        int splits = 0;
        const double us = b.gemm_us(sh.k, sh.n, K, 1, GemmPath::F16, 0, &splits);
        const double gbs = static_cast<double>(sh.k) * sh.n * K / 8 / (us * 1e-6) / 1e9;
        std::printf("%-18s %2d %4d %-5s %6d %10.2f %9.0f %6.1f%%\n", sh.name, K, 1, "f16", splits, us, gbs,
                    100.0 * gbs / b.copy_gbs);
        std::fflush(stdout);
      }
    }

    if (sweep) {
      std::printf("\nblocks-per-group sweep (K=3): shape m best_grid best_us [grid:us ...]\n");
      for (const Shape& sh : shapes) {
        for (int m : {1, 4}) {
          double best = 1e30;
          int best_s = 0;
          std::string line;
          for (int sp : {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 64}) {
            if (sp * 8 > sh.k / 16 || sh.k / sp > 1024 + 127) continue;
            int used = 0;
            const double us = b.gemm_us(sh.k, sh.n, 3, m, GemmPath::Auto, sp, &used);
            line += " " + std::to_string(used) + ":" + std::to_string(us).substr(0, 6);
            if (us < best) best = us, best_s = used;
          }
          std::printf("%-18s %d %3d %8.2f [%s ]\n", sh.name, m, best_s, best, line.c_str());
          std::fflush(stdout);
        }
      }
    }
  }

  // ---- a whole MoE decode layer: 6 routed experts + shared, 5120 -> 2304 -> 5120 ----
  const int n_experts = 384, hidden = 5120, inter = 2304, topk = 6;
  std::printf("\nMoE layer (DeepSeek-V4.1: %d experts, top-%d + shared, %d->%d->%d): the stream path (3 launches)\n"
              "and the grouped kernels (4 launches, MoeParams::stream = 0)\n",
              n_experts, topk, hidden, inter, hidden);
  std::printf("%2s %2s %10s %12s %10s %8s %12s\n", "K", "m", "us/layer", "floor us", "x floor", "GB/s", "grouped us");
  for (int K : Ks) {
    const size_t mat_bytes = static_cast<size_t>(hidden) * inter * K / 8;
    // Every expert matrix gets its own memory (filled by copies of the random pool).
    const size_t need = mat_bytes * 3 * (n_experts + 1);
    uint8_t* moe_pool;
    ck(cudaMalloc(&moe_pool, need), "moe pool");
    for (size_t off = 0; off < need; off += pool.bytes)
      ck(cudaMemcpy(moe_pool + off, pool.p, std::min(pool.bytes, need - off), cudaMemcpyDeviceToDevice), "fill");
    std::vector<Exl3Matrix> tg, tu, td;
    for (int e = 0; e <= n_experts; ++e) {
      tg.push_back(b.matrix(hidden, inter, K, 0));
      tu.push_back(tg.back());
      td.push_back(b.matrix(inter, hidden, K, 0));
      tg.back().trellis = reinterpret_cast<const uint16_t*>(moe_pool + (3 * e + 0) * mat_bytes);
      tu.back().trellis = reinterpret_cast<const uint16_t*>(moe_pool + (3 * e + 1) * mat_bytes);
      td.back().trellis = reinterpret_cast<const uint16_t*>(moe_pool + (3 * e + 2) * mat_bytes);
    }
    Exl3Matrix *dg, *du, *dd;
    ck(cudaMalloc(&dg, tg.size() * sizeof(Exl3Matrix)), "tables");
    ck(cudaMalloc(&du, tu.size() * sizeof(Exl3Matrix)), "tables");
    ck(cudaMalloc(&dd, td.size() * sizeof(Exl3Matrix)), "tables");
    cudaMemcpy(dg, tg.data(), tg.size() * sizeof(Exl3Matrix), cudaMemcpyHostToDevice);
    cudaMemcpy(du, tu.data(), tu.size() * sizeof(Exl3Matrix), cudaMemcpyHostToDevice);
    cudaMemcpy(dd, td.data(), td.size() * sizeof(Exl3Matrix), cudaMemcpyHostToDevice);
    for (int m : {1, 4, 8}) {
      // Many different routings, one per captured call, so that no call reuses the previous
      // call's experts from L2.
      const int calls = 64;
      std::mt19937 rng(11 + m);
      std::vector<int32_t> ids(static_cast<size_t>(calls) * m * topk);
      std::vector<float> wts(ids.size(), 0.25f);
      for (int c = 0; c < calls; ++c)
        for (int t = 0; t < m; ++t) {
          std::vector<int> perm(n_experts);
          for (int e = 0; e < n_experts; ++e) perm[e] = e;
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int j = 0; j < topk; ++j) ids[(static_cast<size_t>(c) * m + t) * topk + j] = perm[j];
        }
      int32_t* d_ids;
      float* d_w;
      ck(cudaMalloc(&d_ids, ids.size() * 4), "ids");
      ck(cudaMalloc(&d_w, wts.size() * 4), "w");
      cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(d_w, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice);
      dsv41::ops::MoeParams p;
      p.gate = dg;
      p.up = du;
      p.down = dd;
      p.n_experts = n_experts;
      p.has_shared = true;
      p.hidden = hidden;
      p.inter = inter;
      p.max_bits = K;
      p.x = b.x;
      p.x_type = ActType::BF16;
      p.m = m;
      p.x_cols = p.x_stride = hidden;
      p.topk = topk;
      p.y = b.y;
      p.y_type = ActType::F32;
      p.y_cols = p.y_stride = hidden;
      p.topk_ids = d_ids;
      p.topk_weights = d_w;
      p.gate_up_bits = p.down_bits = K;  // one kind per projection: the stream path
      p.gate_up_codebook = p.down_codebook = 2;
      dsv41::ops::MoeParams grouped = p;
      grouped.stream = 0;
      size_t wsb = std::max(dsv41::ops::exl3_moe_workspace_bytes(p), dsv41::ops::exl3_moe_workspace_bytes(grouped));
      if (sweep) {  // room for the sweep's largest split counts
        dsv41::ops::MoeParams big = grouped;
        big.splits_gate_up = 20;
        big.splits_down = 18;
        wsb = std::max(wsb, dsv41::ops::exl3_moe_workspace_bytes(big));
      }
      void* ws;
      ck(cudaMalloc(&ws, wsb), "moe workspace");
      dsv41::ops::exl3_workspace_init(ws, wsb, s);
      p.workspace = ws;
      p.workspace_bytes = wsb;
      p.topk_ids = d_ids;
      p.topk_weights = d_w;
      grouped.workspace = ws;
      grouped.workspace_bytes = wsb;
      auto time_moe = [&](dsv41::ops::MoeParams& q) {
        q.topk_ids = d_ids;
        q.topk_weights = d_w;
        dsv41::ops::exl3_moe(q, s);  // eager first call (one-time kernel attribute setup)
        ck(cudaStreamSynchronize(s), "first moe call");
        return time_graph(s, calls, [&](int c) {
          q.topk_ids = d_ids + static_cast<size_t>(c) * m * topk;
          q.topk_weights = d_w + static_cast<size_t>(c) * m * topk;
          dsv41::ops::exl3_moe(q, s);
        });
      };
      const double us = time_moe(p);
      const double us_grouped = time_moe(grouped);
      // Bytes floor: the distinct experts' trellis read once (the average number of distinct
      // experts over the captured routings, plus the shared one).
      double distinct = 0;
      for (int c = 0; c < calls; ++c) {
        std::vector<int> u(ids.begin() + static_cast<size_t>(c) * m * topk,
                           ids.begin() + static_cast<size_t>(c + 1) * m * topk);
        std::sort(u.begin(), u.end());
        distinct += static_cast<double>(std::unique(u.begin(), u.end()) - u.begin()) + 1;
      }
      distinct /= calls;
      const double bytes = distinct * 3 * mat_bytes;
      const double floor_us = bytes / (b.copy_gbs * 1e9) * 1e6;
      std::printf("%2d %2d %10.2f %12.2f %10.2f %8.0f %12.2f\n", K, m, us, floor_us, us / floor_us,
                  bytes / (us * 1e-6) / 1e9, us_grouped);
      std::fflush(stdout);
      if (sweep && m <= 4) {
        // Forced k-splits of the gate/up and down kernels, and the exact fp16 path (int8 off).
        std::printf("   sweep m=%d (grouped kernels): gate/up splits x down splits [int8]: us\n  ", m);
        for (int i8 : {-1, 0})
          for (int sg : {5, 6, 8, 10, 20})
            for (int sd : {3, 4, 6, 9, 18}) {
              grouped.splits_gate_up = sg;
              grouped.splits_down = sd;
              grouped.int8 = i8;
              const size_t need_ws = dsv41::ops::exl3_moe_workspace_bytes(grouped);
              if (need_ws > grouped.workspace_bytes) continue;
              const double t = time_graph(s, calls, [&](int c) {
                grouped.topk_ids = d_ids + static_cast<size_t>(c) * m * topk;
                grouped.topk_weights = d_w + static_cast<size_t>(c) * m * topk;
                dsv41::ops::exl3_moe(grouped, s);
              });
              std::printf(" %d/%d%s:%.1f", sg, sd, i8 == 0 ? "f" : "", t);
            }
        std::printf("\n");
        grouped.splits_gate_up = grouped.splits_down = 0;
        grouped.int8 = -1;
        std::fflush(stdout);
      }
      cudaFree(ws);
      cudaFree(d_ids);
      cudaFree(d_w);
    }
    cudaFree(dg);
    cudaFree(du);
    cudaFree(dd);
    cudaFree(moe_pool);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_exl3: error: %s\n", e.what());
  return 1;
}
