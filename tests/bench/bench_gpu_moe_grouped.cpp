// Routed FP4 experts at the real shapes (configs/deepseek-v4.1-flash.json: every routed expert of a
// layer, hidden_size x moe_intermediate_size, num_experts_per_tok slots per token, uniform random
// routing): the grouped tensor-core path (gpu::moe_grouped) against the exact per-pair path the
// engine runs otherwise (lin4 gate, lin4 up, swiglu, act_quant8, lin4 down), at passes of 1 .. 8192
// tokens. Prints µs per pass, TFLOP/s (6·pairs·hidden·inter) and % of the H200's 989 TFLOP/s dense
// bf16, the weight bytes of the experts the pass touches per second (% of the 4.3 TB/s copy
// ceiling), and the pass size the 40 % target needs. Checks its outputs once against the CPU
// reference engine (model::run_expert on the experts of a few pairs) and the two GPU paths against
// each other; exits 1 when a check fails.
//
// Every pass also runs each tile shape of the grouped path (MoeGroupedArgs::tile_variant 1..5) and
// checks that they agree bit for bit with the automatic one (every output element's arithmetic is
// the same whatever the tiling). The grouped runs take the scaled path (MoeGroupedArgs::rows16, as
// the engine does) with its whole-K sums; a "fold" row times the scaled path folding 32-wide blocks
// one by one (MoeGroupedArgs::block_fold: the numerics before the whole-K sums) and checks it within
// the bf16 bound of them, a "codes" row times the path without the f16 rows and checks the fold's
// bits, and a line counts the rows that converted exactly.
//
// Usage: bench_gpu_moe_grouped [tokens,tokens,...]   (default 1,16,64,256,512,1024,2048,8192;
//                                                      allocates ~9 GB of device memory)
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dsv41/common/parallel.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "harness.h"
#include "model/cpu_impl.h"
#include "model/linears.h"

namespace {

using namespace dsv41;
using dsv41::test::DeviceBuffer;
namespace gpu = dsv41::ops::gpu;

constexpr double kDenseBf16 = 989e12;   // H200 dense bf16 tensor throughput (spec)
constexpr double kCopyCeiling = 4.3e12;  // H200 device copy, bytes/s
bool g_failed = false;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu_moe_grouped: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Expert e of bank `bank`, deterministic: packed e2m1 bytes and E8M0 scales in [lo, lo+7].
struct ExpertBytes {
  std::vector<uint8_t> packed, scales;
};
ExpertBytes expert_bytes(int bank, int64_t e, int64_t out, int64_t in, int lo) {
  ExpertBytes x;
  x.packed.resize(static_cast<size_t>(out * in / 2));
  x.scales.resize(static_cast<size_t>(out * in / 32));
  const uint64_t seed = mix64(static_cast<uint64_t>(bank) * 1000003ull + static_cast<uint64_t>(e));
  for (size_t i = 0; i < x.packed.size(); i += 8) {
    const uint64_t r = mix64(seed ^ (i * 0x2545F4914F6CDD1Dull));
    std::memcpy(&x.packed[i], &r, std::min<size_t>(8, x.packed.size() - i));
  }
  for (size_t i = 0; i < x.scales.size(); ++i)
    x.scales[i] = static_cast<uint8_t>(lo + (mix64(seed + 7 * i + 1) & 7));
  return x;
}

struct Bank {
  DeviceBuffer packed, scales;
  int64_t in = 0, out = 0, n = 0;
  int id = 0, lo = 0;
  Bank(int id_, int64_t n_, int64_t out_, int64_t in_, int lo_)
      : packed(static_cast<size_t>(n_ * out_ * in_ / 2)), scales(static_cast<size_t>(n_ * out_ * in_ / 32)), in(in_),
        out(out_), n(n_), id(id_), lo(lo_) {
    const int64_t group = 16;  // experts generated in parallel, then uploaded
    for (int64_t e0 = 0; e0 < n; e0 += group) {
      const int64_t cnt = std::min(group, n - e0);
      std::vector<ExpertBytes> xs(static_cast<size_t>(cnt));
      parallel_for(cnt, [&](int64_t b, int64_t end) {
        for (int64_t i = b; i < end; ++i) xs[i] = expert_bytes(id, e0 + i, out, in, lo);
      }, 1);
      for (int64_t i = 0; i < cnt; ++i) {
        packed.upload(xs[i].packed.data(), xs[i].packed.size(), static_cast<size_t>((e0 + i) * out * in / 2));
        scales.upload(xs[i].scales.data(), xs[i].scales.size(), static_cast<size_t>((e0 + i) * out * in / 32));
      }
    }
  }
  gpu::Fp4Weight weight() const { return {packed.as<uint8_t>(), scales.as<uint8_t>(), in, out, n}; }
};

struct Pass {
  int64_t n = 0, pairs = 0;
  std::vector<int32_t> ids;
  std::vector<float> route, x;
  int64_t touched = 0;  // distinct experts
};
Pass make_pass(int64_t n, int64_t K, int64_t E, int64_t dim, uint64_t seed) {
  Pass p;
  p.n = n;
  p.pairs = n * K;
  test::Rng rng(seed);
  std::set<int32_t> used;
  for (int64_t t = 0; t < n; ++t) {
    std::set<int32_t> mine;
    while (static_cast<int64_t>(mine.size()) < K) mine.insert(static_cast<int32_t>(rng.below(E)));
    for (int32_t e : mine) {
      p.ids.push_back(e);
      used.insert(e);
    }
  }
  p.route.resize(static_cast<size_t>(p.pairs));
  for (auto& r : p.route) r = rng.uniform(0.1f, 1.0f);
  p.x = rng.bf16_vec(static_cast<size_t>(n * dim));
  p.touched = static_cast<int64_t>(used.size());
  return p;
}

// Device buffers of one pass for both paths.
struct Buffers {
  DeviceBuffer x, x_codes, x_scales, ids, route, eg, eu, codes, scales, sort, y, rows16;
  int64_t sort_ints = 0;
  Buffers(const Pass& p, int64_t dim, int64_t inter, int64_t E, bool exact_path, int64_t sort_ints_)
      : x(DeviceBuffer::from(p.x)), x_codes(static_cast<size_t>(p.n * dim)), x_scales(static_cast<size_t>(p.n * dim / 32) * 4),
        ids(DeviceBuffer::from(p.ids)), route(DeviceBuffer::from(p.route)),
        eg(static_cast<size_t>(p.pairs * inter) * 4), eu(exact_path ? static_cast<size_t>(p.pairs * inter) * 4 : 4),
        codes(static_cast<size_t>(p.pairs * inter)), scales(static_cast<size_t>(p.pairs * inter / 32) * 4),
        sort(static_cast<size_t>(sort_ints_) * 4), y(static_cast<size_t>(p.pairs * dim) * 4),
        rows16(static_cast<size_t>(gpu::moe_grouped_rows16_bytes(p.n, p.pairs / p.n, dim, inter))), sort_ints(sort_ints_) {
    gpu::ActQuantArgs q{x.as<float>(), p.n, dim, dim, x_codes.as<uint8_t>(), x_scales.as<float>()};
    gpu::act_quant8(q, nullptr);
  }
};

// scaled: with the f16 row scratch (the engine's default), else the codes path throughout;
// block_fold: the scaled path folding its 32-wide blocks one by one (the codes path's bits) instead
// of summing the whole K in the MMAs.
void run_grouped(const Bank& w1, const Bank& w3, const Bank& w2, const Pass& p, Buffers& b, float limit, int64_t K,
                 int variant = 0, bool scaled = true, bool block_fold = false) {
  gpu::MoeGroupedArgs a;
  a.w1 = w1.weight();
  a.w3 = w3.weight();
  a.w2 = w2.weight();
  a.x_codes = b.x_codes.as<uint8_t>();
  a.x_scales = b.x_scales.as<float>();
  a.n = p.n;
  a.top_k = K;
  a.expert_ids = b.ids.as<int32_t>();
  a.route_w = b.route.as<float>();
  a.swiglu_limit = limit;
  a.act = b.eg.as<float>();
  a.act_codes = b.codes.as<uint8_t>();
  a.act_scales = b.scales.as<float>();
  a.sort = b.sort.as<int32_t>();
  a.sort_ints = b.sort_ints;
  a.y = b.y.as<float>();
  a.tile_variant = variant;
  a.block_fold = block_fold;
  if (scaled) {
    a.rows16 = b.rows16.get();
    a.rows16_bytes = static_cast<int64_t>(b.rows16.bytes());
  }
  gpu::moe_grouped(a, nullptr);
}

// The engine's exact path (cuda_moe.cpp without grouping).
void run_exact(const Bank& w1, const Bank& w3, const Bank& w2, const Pass& p, Buffers& b, float limit, int64_t K) {
  const int64_t dim = w1.in, inter = w1.out;
  auto bank = [&](const Bank& w, const uint8_t* codes, const float* scales, int64_t div, float* y) {
    gpu::Lin4Args a;
    a.w = w.weight();
    a.x_codes = codes;
    a.x_scales = scales;
    a.rows = p.pairs;
    a.expert_ids = b.ids.as<int32_t>();
    a.x_row_div = div;
    a.y = y;
    a.y_stride = w.out;
    gpu::lin4(a, nullptr);
  };
  bank(w1, b.x_codes.as<uint8_t>(), b.x_scales.as<float>(), K, b.eg.as<float>());
  bank(w3, b.x_codes.as<uint8_t>(), b.x_scales.as<float>(), K, b.eu.as<float>());
  gpu::SwigluArgs s{b.eg.as<float>(), b.eu.as<float>(), p.pairs, inter, b.route.as<float>(), limit, b.eg.as<float>()};
  gpu::swiglu(s, nullptr);
  gpu::ActQuantArgs q{b.eg.as<float>(), p.pairs, inter, inter, b.codes.as<uint8_t>(), b.scales.as<float>()};
  gpu::act_quant8(q, nullptr);
  bank(w2, b.codes.as<uint8_t>(), b.scales.as<float>(), 1, b.y.as<float>());
  (void)dim;
}

std::vector<float> download(const DeviceBuffer& d, size_t n) {
  std::vector<float> v(n);
  d.download(v.data(), n * 4);
  return v;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want, size_t* exact = nullptr) {
  const test::Compare c = test::compare(got, want);
  if (exact) *exact = c.exact;
  return c.mismatched_nonfinite ? INFINITY : c.nmse;
}

// The CPU reference engine on the first `count` pairs of the pass.
void check_cpu(const Bank& w1, const Bank& w3, const Bank& w2, const Pass& p, const std::vector<float>& got_y,
               const ModelConfig& c, int64_t count) {
  const int64_t dim = w1.in, inter = w1.out, K = c.num_experts_per_tok;
  char tmpl[] = "/tmp/dsv41_bench_moe_XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) {
    std::fprintf(stderr, "bench_gpu_moe_grouped: mkdtemp failed\n");
    std::exit(1);
  }
  const std::string dir = d;
  {
    SafetensorsWriter w;
    std::vector<ExpertBytes> keep;
    keep.reserve(static_cast<size_t>(3 * count));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t e = p.ids[i];
      const std::string pre = "p" + std::to_string(i) + ".";
      const struct {
        const Bank* b;
        const char* name;
      } mats[] = {{&w1, "w1"}, {&w3, "w3"}, {&w2, "w2"}};
      for (const auto& m : mats) {
        keep.push_back(expert_bytes(m.b->id, e, m.b->out, m.b->in, m.b->lo));
        const ExpertBytes& x = keep.back();
        w.add(pre + m.name + ".weight", DType::I8, {m.b->out, m.b->in / 2}, x.packed.data(), x.packed.size());
        w.add(pre + m.name + ".scale", DType::F8_E8M0, {m.b->out, m.b->in / 32}, x.scales.data(), x.scales.size());
      }
    }
    w.write(dir + "/weights.safetensors");
  }
  {
    auto ckpt = Checkpoint::open(dir);
    std::vector<float> want(static_cast<size_t>(count * dim)), got(static_cast<size_t>(count * dim));
    for (int64_t i = 0; i < count; ++i) {
      const std::string pre = "p" + std::to_string(i) + ".";
      model::Expert ex;
      ex.w1 = model::load_linear(*ckpt, pre + "w1", dim, inter);
      ex.w3 = model::load_linear(*ckpt, pre + "w3", dim, inter);
      ex.w2 = model::load_linear(*ckpt, pre + "w2", inter, dim);
      model::run_expert(ex, &p.x[(i / K) * dim], 1, &p.route[i], c.swiglu_limit, &want[i * dim]);
      std::copy_n(&got_y[i * dim], dim, &got[i * dim]);
    }
    size_t exact = 0;
    const double e = nmse(got, want, &exact);
    const bool ok = e <= test::kNmseBf16;
    std::printf("check: grouped vs CPU reference (run_expert), %lld pairs: nmse %.3e, bit-identical %zu/%zu  %s\n",
                static_cast<long long>(count), e, exact, want.size(), ok ? "ok" : "FAILED");
    if (!ok) g_failed = true;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> token_counts = {1, 16, 64, 256, 512, 1024, 2048, 8192};
  if (argc > 1) {
    token_counts.clear();
    for (const char* q = argv[1]; *q;) {
      char* end = nullptr;
      const long long v = std::strtoll(q, &end, 10);
      if (end == q || v < 1 || v > 65536) {
        std::fprintf(stderr, "bench_gpu_moe_grouped: bad token list '%s' (comma-separated counts 1..65536)\n", argv[1]);
        return 1;
      }
      token_counts.push_back(v);
      q = *end == ',' ? end + 1 : end;
      if (*end && *end != ',') {
        std::fprintf(stderr, "bench_gpu_moe_grouped: bad token list '%s'\n", argv[1]);
        return 1;
      }
    }
  }
  const ModelConfig c = load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  const int64_t dim = c.hidden_size, inter = c.moe_intermediate_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);
  std::printf("routed experts: %lld experts of %lldx%lld (w1, w3) + %lldx%lld (w2), top-%lld; grouped path %s\n",
              static_cast<long long>(E), static_cast<long long>(inter), static_cast<long long>(dim),
              static_cast<long long>(dim), static_cast<long long>(inter), static_cast<long long>(K),
              gpu::moe_grouped_supported(dim, inter) ? "supported" : "NOT supported");
  const Bank w1(1, E, inter, dim, 114), w3(3, E, inter, dim, 114), w2(2, E, dim, inter, 116);
  ck(cudaDeviceSynchronize(), "upload");
  const double expert_bytes_each = 3.0 * static_cast<double>(dim * inter) * (0.5 + 1.0 / 32.0);

  std::printf("%8s %7s %8s %5s | %11s %9s %7s %9s | %11s %9s %7s | %7s %s\n", "tokens", "pairs", "experts", "tile",
              "grouped us", "TFLOP/s", "%989", "%4.3TB/s", "exact us", "TFLOP/s", "%989", "speedup", "nmse(grouped,exact)");
  double best_tflops = 0;
  int64_t first_40 = -1;
  for (int64_t n : token_counts) {
    const Pass p = make_pass(n, K, E, dim, static_cast<uint64_t>(n) * 7919 + 1);
    const bool exact_path = n <= 512;
    // Scratch for the narrowest tiles, so every forced shape runs as asked.
    Buffers b(p, dim, inter, E, exact_path, gpu::moe_grouped_sort_ints(p.pairs, E, 16));
    const double flop = 6.0 * static_cast<double>(p.pairs) * static_cast<double>(dim) * static_cast<double>(inter);
    const double moved = static_cast<double>(p.touched) * expert_bytes_each;
    const int reps = n <= 256 ? 10 : n <= 2048 ? 5 : 3;
    const int auto_variant = gpu::moe_grouped_auto_variant(p.pairs, E);
    auto row = [&](const char* tile, double tg) {
      const double tf = flop / (tg * 1e-6) / 1e12;
      std::printf("%8lld %7lld %8lld %5s | %11.1f %9.2f %6.2f%% %8.1f%% |", static_cast<long long>(n),
                  static_cast<long long>(p.pairs), static_cast<long long>(p.touched), tile, tg, tf,
                  100.0 * tf * 1e12 / kDenseBf16, 100.0 * moved / (tg * 1e-6) / kCopyCeiling);
      return tf;
    };
    // Each forced tile shape, then the automatic one (whose output the checks use).
    constexpr int kShapes = gpu::kMoeGroupedVariants;
    std::vector<float> yv[kShapes + 1];
    const char* names[kShapes + 1] = {"auto", "64", "32", "16", "16/3", "64w8"};
    for (int v = 1; v <= kShapes; ++v) {
      const double tv = test::time_us([&] { run_grouped(w1, w3, w2, p, b, limit, K, v); }, reps);
      ck(cudaDeviceSynchronize(), "grouped");
      yv[v] = download(b.y, static_cast<size_t>(p.pairs * dim));
      row(names[v], tv);
      std::printf("\n");
    }
    const double tg = test::time_us([&] { run_grouped(w1, w3, w2, p, b, limit, K); }, reps);
    ck(cudaDeviceSynchronize(), "grouped");
    const std::vector<float> yg = download(b.y, static_cast<size_t>(p.pairs * dim));
    for (int v = 1; v <= kShapes; ++v)
      if (std::memcmp(yv[v].data(), yg.data(), yg.size() * 4) != 0) {
        std::printf("check: tile shape %s differs from the automatic one at %lld tokens  FAILED\n", names[v],
                    static_cast<long long>(n));
        g_failed = true;
      }
    if (n == 256) check_cpu(w1, w3, w2, p, yg, c, 4);
    // The scaled path with its blocks folded one by one (the numerics before the whole-K sums) and
    // the codes path throughout (no f16 rows): the same bits as each other, within the bf16 bound
    // of the whole-K sums, and how much each form gains.
    const double tb = test::time_us([&] { run_grouped(w1, w3, w2, p, b, limit, K, 0, true, true); }, reps);
    ck(cudaDeviceSynchronize(), "grouped, blocks folded");
    const std::vector<float> yb = download(b.y, static_cast<size_t>(p.pairs * dim));
    row("fold", tb);
    {
      size_t same = 0;
      const double e = nmse(yg, yb, &same);
      std::printf(" whole K against blocks folded: nmse %.2e, %.4f bit-identical%s\n", e,
                  static_cast<double>(same) / static_cast<double>(yg.size()), e <= test::kNmseBf16 ? "" : "  FAILED");
      if (!(e <= test::kNmseBf16)) g_failed = true;
    }
    const double tc = test::time_us([&] { run_grouped(w1, w3, w2, p, b, limit, K, 0, false); }, reps);
    ck(cudaDeviceSynchronize(), "grouped codes path");
    if (std::memcmp(download(b.y, static_cast<size_t>(p.pairs * dim)).data(), yb.data(), yb.size() * 4) != 0) {
      std::printf("check: the codes path differs from the scaled path's block fold at %lld tokens  FAILED\n",
                  static_cast<long long>(n));
      g_failed = true;
    }
    row("codes", tc);
    std::printf("\n");
    {  // rows the last scaled run (the codes path leaves the scratch alone) took that path
      const int64_t off = gpu::moe_grouped_rows16_info_offset(p.n, K, dim, inter);
      const std::vector<int32_t> info =
          b.rows16.to_host<int32_t>(static_cast<size_t>(p.n + p.pairs), static_cast<size_t>(off / 4));
      auto scaled = [&](int64_t from, int64_t count) {
        return std::count_if(info.begin() + from, info.begin() + from + count, [](int32_t c) { return c != INT32_MIN; });
      };
      std::printf("  scaled path: %lld of %lld token rows, %lld of %lld pair rows\n", static_cast<long long>(scaled(0, p.n)),
                  static_cast<long long>(p.n), static_cast<long long>(scaled(p.n, p.pairs)), static_cast<long long>(p.pairs));
    }
    char auto_name[16];
    std::snprintf(auto_name, sizeof auto_name, "a=%s", names[auto_variant]);
    const double tf = row(auto_name, tg);
    best_tflops = std::max(best_tflops, tf);
    if (first_40 < 0 && tf >= 0.4 * kDenseBf16 / 1e12) first_40 = n;
    if (exact_path) {
      const double te = test::time_us([&] { run_exact(w1, w3, w2, p, b, limit, K); }, n <= 256 ? 3 : 1);
      ck(cudaDeviceSynchronize(), "exact");
      size_t exact = 0;
      const double e = nmse(yg, download(b.y, static_cast<size_t>(p.pairs * dim)), &exact);
      if (!(e <= test::kNmseBf16)) g_failed = true;
      std::printf(" %11.1f %9.2f %6.3f%% | %6.1fx %.2e (%.4f bit-identical)%s\n", te, flop / (te * 1e-6) / 1e12,
                  100.0 * flop / (te * 1e-6) / kDenseBf16, te / tg, e, static_cast<double>(exact) / static_cast<double>(yg.size()),
                  e <= test::kNmseBf16 ? "" : "  FAILED");
    } else {
      std::printf(" %11s %9s %7s | %7s\n", "-", "-", "-", "-");
    }
  }
  // Roofline: a pass touching every expert reads all their weights once, so at the copy ceiling it
  // reaches 40 % of 989 TFLOP/s only with enough pairs per expert.
  const double per_expert_flop_per_pair = 6.0 * static_cast<double>(dim * inter);
  const double pairs_per_expert = 0.4 * kDenseBf16 / kCopyCeiling * expert_bytes_each / per_expert_flop_per_pair;
  const std::string reached = first_40 > 0 ? "first at " + std::to_string(first_40) + " tokens per pass" : "not reached";
  std::printf("40%% of 989 TFLOP/s = %.0f TFLOP/s: measured %s (best %.1f TFLOP/s); "
              "bandwidth roofline needs >= %.1f pairs per expert = %.0f tokens per pass\n",
              0.4 * kDenseBf16 / 1e12, reached.c_str(), best_tflops, pairs_per_expert,
              std::ceil(pairs_per_expert * static_cast<double>(E) / static_cast<double>(K)));
  if (g_failed) {
    std::printf("bench_gpu_moe_grouped: a check FAILED\n");
    return 1;
  }
  return 0;
}
