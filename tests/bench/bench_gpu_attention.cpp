// CSA2 attention kernels at the real shapes (configs/deepseek-v4.1-flash.json): sparse attention
// with sink (window + index_topk rows of head_dim bf16 values per query, all heads) and the indexer
// scores (index_n_heads x index_head_dim queries against every visible index key), each timed as
// the kernel the engine used before this change and as the one it uses now, at m = 1, 2, 4 queries
// (decode, one sequence each) and at prefill pass sizes 64 and 256 (sparse attention also as FLOP/s
// against the fp32 FMA ceiling). Inputs rotate through enough
// distinct buffers that the 60 MB L2 cannot serve repeated calls. Every case checks its output: the
// new kernel against the previous one bit for bit, and once (m = 1) against the CPU reference. At
// decode sizes every variant of the split attention kernel (with the clusters the device holds at
// once) and of the tiled indexer is timed and checked as well; the window-only list (a layer
// without compressed rows) is timed at 1 and 4 queries. The index top-k replay is timed at decode
// and prefill shapes, every row checked against the CPU engine's selection.
//
// Usage: bench_gpu_attention            (prints one line per case)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "model/ops/dot.h"
#include "model/ops/quant.h"
#include "model/ops/sparse_attn.h"
#include "model/ops/topk.h"

namespace {

using namespace dsv41;
using dsv41::test::DeviceBuffer;
namespace gpu = dsv41::ops::gpu;

constexpr double kCopyCeiling = 4.3e12;  // H200 device copy, bytes/s
constexpr double kFp32Ceiling = 67e12;  // H200 fp32 FMA peak, FLOP/s (132 SMs x 128 lanes x 2 x 1.98 GHz)
constexpr size_t kRotateBytes = size_t{160} << 20;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu_attention: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

int g_failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("  CHECK FAILED: %s\n", what.c_str());
    ++g_failures;
  }
}

// Mean µs per call of launch(i) over calls cycling through `instances`; the repetition count
// adapts so that slow kernels take about a fifth of a second.
double time_calls(const std::function<void(int)>& launch, int instances) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  launch(0);
  ck(cudaDeviceSynchronize(), "warm-up");
  cudaEventRecord(a);
  launch(1 % instances);
  cudaEventRecord(b);
  ck(cudaEventSynchronize(b), "probe");
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  const int reps = std::clamp(static_cast<int>(200.0 / std::max(ms, 1e-3f)), 3, 200);
  cudaEventRecord(a);
  for (int r = 0; r < reps; ++r) launch(r % instances);
  cudaEventRecord(b);
  ck(cudaEventSynchronize(b), "timed calls");
  cudaEventElapsedTime(&ms, a, b);
  ck(cudaGetLastError(), "launches");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / reps;
}

void report(const char* op, const std::string& shape, const char* kernel, double us, double bytes) {
  const double gbs = bytes / (us * 1e-6) / 1e9;
  std::printf("%-12s %-34s %-15s %9.1f us/call %8.1f GB/s %6.2f %% of 4.3 TB/s\n", op, shape.c_str(), kernel, us, gbs,
              100.0 * gbs * 1e9 / kCopyCeiling);
}

// Random bf16 bits (normal, sd 1) filling n values quickly: a table of 4096 values indexed by a
// xorshift stream.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float sd = 1.0f) {
  test::Rng rng(seed);
  std::vector<uint16_t> table(4096);
  for (auto& v : table) v = f32_to_bf16_bits(bf16_round(rng.normal(sd)));
  std::vector<uint16_t> out(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : out) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    v = table[(s * 2685821657736338717ull) >> 52];
  }
  return out;
}

// ---- sparse attention --------------------------------------------------------------------------
// list_len 0: window + index_topk (a compressed layer); the window alone is a layer without one.
void bench_sparse_attn(const ModelConfig& c, int64_t m, int64_t list_len = 0) {
  const int64_t H = c.num_attention_heads, d = c.head_dim, win = c.sliding_window;
  const int64_t L = list_len > 0 ? list_len : win + c.index_topk;
  const std::string shape = "m=" + std::to_string(m) + " H=" + std::to_string(H) + " d=" + std::to_string(d) +
                            " rows=" + std::to_string(L);
  // Query t of an instance owns L rows; its list names them in order (window rows from pool_a, the
  // rest from pool_b) with every ninth entry of the selection empty (-1), as early decode steps have.
  const size_t inst_rows = static_cast<size_t>(m * L), inst_bytes = inst_rows * d * 2;
  const int instances = static_cast<int>(std::clamp<size_t>(kRotateBytes / inst_bytes, 1, 256));
  std::vector<uint16_t> rows_host = random_bf16(inst_rows * d * instances, 7 + m);
  DeviceBuffer rows = DeviceBuffer::from(rows_host);
  std::vector<const uint16_t*> pa, pb;
  for (int i = 0; i < instances; ++i)
    for (int64_t t = 0; t < m; ++t) {
      const uint16_t* base = rows.as<uint16_t>() + (static_cast<size_t>(i) * inst_rows + t * L) * d;
      pa.push_back(base);
      pb.push_back(base + win * d);
    }
  DeviceBuffer dpa = DeviceBuffer::from(pa), dpb = DeviceBuffer::from(pb);
  std::vector<int32_t> list(static_cast<size_t>(m * L));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t j = 0; j < L; ++j) list[t * L + j] = (j >= win && j % 9 == 4) ? -1 : static_cast<int32_t>(j);
  test::Rng rng(3);
  std::vector<float> q = rng.bf16_vec(static_cast<size_t>(m * H * d)), sink = rng.f32_vec(static_cast<size_t>(H));
  DeviceBuffer dq = DeviceBuffer::from(q), dsink = DeviceBuffer::from(sink), dlist = DeviceBuffer::from(list);
  DeviceBuffer out_new(static_cast<size_t>(m * H * d) * 4), out_old(static_cast<size_t>(m * H * d) * 4);
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  auto args = [&](int i, float* out) {
    gpu::SparseAttnArgs a;
    a.q = dq.as<float>();
    a.list = dlist.as<int32_t>();
    a.list_len = L;
    a.pool_a = dpa.as<const uint16_t*>() + static_cast<size_t>(i) * m;
    a.pool_b = dpb.as<const uint16_t*>() + static_cast<size_t>(i) * m;
    a.split = win;
    a.sink = dsink.as<float>();
    a.scale = scale;
    a.n_q = m;
    a.heads = H;
    a.d = d;
    a.out = out;
    return a;
  };
  // Before: the call site's choice (one head per block for one query, kPrefillHeads otherwise).
  const int hpb = m == 1 ? 1 : gpu::kPrefillHeads;
  auto old_call = [&](int i) { ck(gpu::raw::sparse_attention_rows(args(i, out_old.as<float>()), hpb, nullptr), "rows kernel"); };
  auto new_call = [&](int i) { ck(gpu::raw::sparse_attention(args(i, out_new.as<float>()), hpb, nullptr), "sparse_attention"); };
  old_call(0);
  new_call(0);
  ck(cudaDeviceSynchronize(), "sparse attention");
  std::vector<float> got(static_cast<size_t>(m * H * d)), prev(got.size());
  out_new.download(got.data(), got.size() * 4);
  out_old.download(prev.data(), prev.size() * 4);
  check(std::memcmp(got.data(), prev.data(), got.size() * 4) == 0, "sparse_attn " + shape + ": new kernel differs from the rows kernel");
  if (m == 1) {
    std::vector<float> pool(static_cast<size_t>(L * d)), want(static_cast<size_t>(H * d));
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = bf16_bits_to_f32(rows_host[i]);
    std::vector<const float*> rp;
    for (int64_t j = 0; j < L; ++j) rp.push_back(list[j] < 0 ? nullptr : &pool[list[j] * d]);
    model::sparse_attention(q.data(), rp, sink.data(), scale, H, d, want.data());
    const test::Compare cmp = test::compare(got, want);
    std::printf("sparse_attn  %-34s vs CPU reference: nmse=%.3e exact=%zu/%zu\n", shape.c_str(), cmp.nmse, cmp.exact, cmp.total);
    check(cmp.mismatched_nonfinite == 0 && cmp.nmse <= test::kNmseBf16, "sparse_attn " + shape + " vs CPU reference");
  }
  const double bytes = static_cast<double>(inst_bytes) + 2.0 * m * H * d * 4 + m * L * 4;
  const double us_old = time_calls(old_call, instances), us_new = time_calls(new_call, instances);
  report("sparse_attn", shape, "before", us_old, bytes);
  report("sparse_attn", shape, "after", us_new, bytes);
  // Decode shapes: every split variant (checked bit for bit against the rows kernel), with the
  // clusters the device holds at once.
  if (m <= 32)
    for (int v = 0; v < gpu::raw::sparse_attention_split_variants(); ++v) {
      const char* name = gpu::raw::sparse_attention_split_variant_name(v);
      if (gpu::raw::sparse_attention_split_variant(args(0, out_new.as<float>()), v, nullptr) == cudaErrorNotSupported) {
        std::printf("%-12s %-34s split variant %s: not supported here\n", "sparse_attn", shape.c_str(), name);
        continue;
      }
      auto var_call = [&](int i) {
        ck(gpu::raw::sparse_attention_split_variant(args(i, out_new.as<float>()), v, nullptr), "split variant");
      };
      const int clusters = gpu::raw::sparse_attention_split_max_clusters(args(0, out_new.as<float>()), v);
      ck(cudaDeviceSynchronize(), "split variant");
      out_new.download(got.data(), got.size() * 4);
      check(std::memcmp(got.data(), prev.data(), got.size() * 4) == 0,
            "sparse_attn " + shape + ": split variant " + name + " differs from the rows kernel");
      const double us = time_calls(var_call, instances);
      std::printf("%-12s %-34s %-15s %9.1f us/call  variant %s, %d clusters resident\n", "sparse_attn", shape.c_str(), "split", us,
                  name, clusters);
    }
  // Arithmetic: per query, list entries x heads x d x 2 (score fma) + the same again (PV), as FLOP;
  // the exact fp32 chains rule out tensor cores, so the fp32 FMA peak is the ceiling.
  const double flop = static_cast<double>(m) * L * H * d * 2.0 * 2.0;
  for (const auto& [kernel, us] : {std::pair<const char*, double>{"before", us_old}, {"after", us_new}})
    std::printf("%-12s %-34s %-7s %9.1f us/call %8.2f TFLOP/s %6.2f %% of %.0f TFLOP/s fp32\n", "sparse_attn", shape.c_str(),
                kernel, us, flop / (us * 1e-6) / 1e12, 100.0 * flop / (us * 1e-6) / kFp32Ceiling, kFp32Ceiling / 1e12);
}

// ---- indexer scores ----------------------------------------------------------------------------
void bench_indexer(const ModelConfig& c, int64_t m, int64_t T) {
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim, ratio = 2;
  // Decode: the query at the last position sees all T entries; prefill: a pass of m rows ending there.
  const int64_t start = ratio * T - m;
  const std::string shape = "m=" + std::to_string(m) + " IH=" + std::to_string(IH) + " ID=" + std::to_string(ID) +
                            " keys=" + std::to_string(T);
  const size_t key_bytes = static_cast<size_t>(T * ID) * 2;
  const int instances = static_cast<int>(std::clamp<size_t>(kRotateBytes / key_bytes, 1, 256));
  std::vector<uint16_t> keys_host = random_bf16(static_cast<size_t>(T * ID) * instances, 20 + m);
  DeviceBuffer keys = DeviceBuffer::from(keys_host);
  test::Rng rng(5);
  std::vector<float> qi = rng.bf16_vec(static_cast<size_t>(m * IH * ID));
  for (int64_t r = 0; r < m * IH; ++r) model::qdq4a_inplace(&qi[r * ID], ID);
  std::vector<float> w = rng.bf16_vec(static_cast<size_t>(m * IH), 0.1f);
  DeviceBuffer dq = DeviceBuffer::from(qi), dw = DeviceBuffer::from(w);
  DeviceBuffer s_new(static_cast<size_t>(m * T) * 4), s_old(static_cast<size_t>(m * T) * 4);
  auto args = [&](int i, float* scores) {
    gpu::IndexerArgs a;
    a.qi = dq.as<float>();
    a.w = dw.as<float>();
    a.keys = keys.as<uint16_t>() + static_cast<size_t>(i) * T * ID;
    a.n_keys = T;
    a.n = m;
    a.heads = IH;
    a.head_dim = ID;
    a.T = T;
    a.start = start;
    a.ratio = ratio;
    a.scores = scores;
    return a;
  };
  auto old_call = [&](int i) { ck(gpu::raw::indexer_scores_warp(args(i, s_old.as<float>()), nullptr), "warp indexer"); };
  auto new_call = [&](int i) { ck(gpu::raw::indexer_scores(args(i, s_new.as<float>()), nullptr), "indexer_scores"); };
  old_call(0);
  new_call(0);
  ck(cudaDeviceSynchronize(), "indexer");
  std::vector<float> got(static_cast<size_t>(m * T)), prev(got.size());
  s_new.download(got.data(), got.size() * 4);
  s_old.download(prev.data(), prev.size() * 4);
  check(std::memcmp(got.data(), prev.data(), got.size() * 4) == 0, "indexer " + shape + ": new kernel differs from the warp kernel");
  if (m == 1) {  // the CPU engine's loop (attention.cpp) for the one query
    const int64_t n_vis = (start + 1) / ratio;
    size_t bad = 0;
    for (int64_t u = 0; u < T; ++u) {
      float want = -std::numeric_limits<float>::infinity();
      if (u < n_vis) {
        std::vector<float> key(static_cast<size_t>(ID));
        for (int64_t k = 0; k < ID; ++k) key[k] = bf16_bits_to_f32(keys_host[u * ID + k]);
        float acc = 0.0f;
        for (int64_t h = 0; h < IH; ++h) {
          const float r = std::max(bf16_round(model::gemm_dot_f32(&qi[h * ID], key.data(), ID)), 0.0f);
          acc += bf16_round(r * w[h]);
        }
        want = bf16_round(acc);
      }
      if (std::memcmp(&want, &got[u], 4) != 0) ++bad;
    }
    std::printf("indexer      %-34s vs CPU reference: %zu/%lld differ\n", shape.c_str(), bad, static_cast<long long>(T));
    check(bad == 0, "indexer " + shape + " vs CPU reference");
  }
  const double bytes = static_cast<double>(key_bytes) + m * IH * ID * 4.0 + m * IH * 4.0 + m * T * 4.0;
  report("indexer", shape, "before", time_calls(old_call, instances), bytes);
  report("indexer", shape, "after", time_calls(new_call, instances), bytes);
  // Decode shapes: every tiled variant, checked bit for bit against the warp kernel.
  if (m <= 4)
    for (int v = 0; v < gpu::raw::indexer_scores_tiled_variants(); ++v) {
      if (gpu::raw::indexer_scores_tiled_variant(args(0, s_new.as<float>()), v, nullptr) == cudaErrorNotSupported) {
        std::printf("%-12s %-34s tiled variant %s: not supported here\n", "indexer", shape.c_str(),
                    gpu::raw::indexer_scores_tiled_variant_name(v));
        continue;
      }
      auto var_call = [&](int i) { ck(gpu::raw::indexer_scores_tiled_variant(args(i, s_new.as<float>()), v, nullptr), "tiled variant"); };
      ck(cudaDeviceSynchronize(), "tiled variant");
      s_new.download(got.data(), got.size() * 4);
      check(std::memcmp(got.data(), prev.data(), got.size() * 4) == 0,
            "indexer " + shape + ": tiled variant " + gpu::raw::indexer_scores_tiled_variant_name(v) + " differs from the warp kernel");
      report("indexer", shape, gpu::raw::indexer_scores_tiled_variant_name(v), time_calls(var_call, instances), bytes);
    }
}

// ---- index top-k (gpu::topk_replay) -------------------------------------------------------------
// rows x T bf16 index-like scores (relu'd: many ties); prefill rows see a growing prefix, the rest
// -inf, like a pass's rows over the layout's columns. The kernel consumes its input, so every call
// first copies a pristine set: the copy is timed alone and subtracted. Every row's selection is
// checked against the CPU engine's (model::topk_sorted), whose time per row (one host thread) is
// printed beside it.
void bench_index_topk(const ModelConfig& c, int64_t rows, int64_t T) {
  const int64_t k = std::min(c.index_topk, T);
  const std::string shape = "rows=" + std::to_string(rows) + " T=" + std::to_string(T) + " k=" + std::to_string(k);
  if (!gpu::topk_replay_fits(T, k)) {
    std::printf("index-topk   %-34s outside the replay's branch\n", shape.c_str());
    return;
  }
  test::Rng rng(static_cast<uint64_t>(rows * 131 + T));
  std::vector<float> v(static_cast<size_t>(rows * T));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t visible = rows == 1 ? T : T - rows + 1 + r;
    for (int64_t u = 0; u < T; ++u)
      v[static_cast<size_t>(r * T + u)] = u < visible ? bf16_round(std::max(0.0f, rng.normal(1.0f)) * 0.25f)
                                                      : -std::numeric_limits<float>::infinity();
  }
  DeviceBuffer pristine = DeviceBuffer::from(v), work(v.size() * 4), idx(v.size() * 2), out(static_cast<size_t>(rows * k) * 4);
  gpu::TopkReplayArgs a;
  a.values = work.as<float>();
  a.idx = idx.as<uint16_t>();
  a.rows = rows;
  a.n = T;
  a.stride = T;
  a.k = k;
  a.out = out.as<int32_t>();
  auto copy = [&](int) { ck(cudaMemcpyAsync(work.get(), pristine.get(), v.size() * 4, cudaMemcpyDeviceToDevice), "copy"); };
  auto call = [&](int i) {
    copy(i);
    ck(gpu::raw::topk_replay(a, nullptr), "topk_replay");
  };
  call(0);
  ck(cudaDeviceSynchronize(), "topk_replay");
  std::vector<int32_t> got(static_cast<size_t>(rows * k));
  out.download(got.data(), got.size() * 4);
  size_t bad = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int32_t> want = model::topk_sorted(&v[static_cast<size_t>(r * T)], T, k);
    bad += !std::equal(want.begin(), want.end(), got.begin() + r * k);
  }
  const double host_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(rows);
  check(bad == 0, "index top-k " + shape + ": " + std::to_string(bad) + " rows differ from the CPU engine");
  const double us = time_calls(call, 1) - time_calls(copy, 1);
  std::printf("index-topk   %-34s %9.1f us/call (%.2f us/row); CPU engine %.1f us/row on one thread; %zu/%lld rows differ\n",
              shape.c_str(), us, us / static_cast<double>(rows), host_us, bad, static_cast<long long>(rows));
}

}  // namespace

int main() {
  try {
    const ModelConfig c = load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
    cudaDeviceProp prop{};
    ck(cudaGetDeviceProperties(&prop, 0), "device properties");
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    for (int64_t m : {1, 2, 4, 64, 256}) bench_sparse_attn(c, m);
    for (int64_t m : {1, 4}) bench_sparse_attn(c, m, c.sliding_window);
    bench_indexer(c, 1, 1024);
    bench_indexer(c, 1, 2048);
    bench_indexer(c, 1, 8192);
    bench_indexer(c, 1, 32768);
    bench_indexer(c, 1, 65536);
    bench_indexer(c, 4, 2048);
    bench_indexer(c, 2, 65536);
    bench_indexer(c, 4, 65536);
    bench_indexer(c, 256, 4096);
    for (int64_t T : {2048, 8192, 16384, 32767}) bench_index_topk(c, 1, T);
    bench_index_topk(c, 4, 16384);
    bench_index_topk(c, 2048, 4096);
    bench_index_topk(c, 2048, 16384);
    // the partial_sort branch (64·k columns and more): decode past 32k context, prefill rows past it
    for (int64_t T : {32768, 65536, 131072}) bench_index_topk(c, 1, T);
    bench_index_topk(c, 4, 65536);
    bench_index_topk(c, 64, 65536);
    bench_index_topk(c, 2048, 65536);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_attention: %s\n", e.what());
    return 1;
  }
  if (g_failures) {
    std::printf("%d check(s) FAILED\n", g_failures);
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
