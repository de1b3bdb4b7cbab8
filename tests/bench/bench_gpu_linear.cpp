// Decode bandwidth of the exact linear kernels (issue 7) at the real shapes of
// configs/deepseek-v4.1-flash.json: Lin8 (FP8 e4m3 + E8M0 32x32 blocks), the FP4 routed-expert bank
// (Lin4 over (token, slot) pairs, gate/up and down), and the dense LinBF16/LinF32 linears (the head
// is the biggest). Rows m = 1, 2, 4 (decode batches) and the prefill pass size 256.
//
// Every case rotates over copies of its weights (or, for the expert bank, over different expert
// picks of the full bank) that together exceed the L2 several times, so each call reads HBM. It
// prints µs/call, the bytes one call must read (weights + scales + activations + outputs), GB/s and
// the share of the 4.3 TB/s copy ceiling; before timing, one call is compared bit for bit with the
// CPU reference engine's own Linear (on a subset of rows / outputs where the full CPU product would
// take long). Exit code 1 when any comparison fails. Calls run back to back on one non-blocking
// stream, as in the model, so programmatic dependent launch overlaps a call with the previous one.
//
// Usage: bench_gpu_linear [--quick | --pairs | --gemm [M,M,...]]   (--quick: m = 1 only, fewer iterations;
// --gemm: the Lin8 shapes at prefill sizes, the GEMM (kernels/ops/lin_gemm.cu, each CTA tile and the
// automatic choice, and the tensor-core GEMM of kernels/ops/lin8_tc_gemm.cu, each tile and the
// default dispatch, on its codes path, its scaled path folding blocks ("/s": Lin8Args::rows16 with
// block_fold; checked bit for bit against the codes path) and the scaled path's default, as the
// engine calls it ("/wk": whole-K sums; checked against the sequential sums like the codes path))
// vs the GEMV kernel, in µs and TFLOP/s;
// --decode: the block-scaled linears at
// m = 1, 2, 4)
// --dense [decode|sweep]: the dense linears at decode sizes (m = 1, 2, 4) on the streaming kernel
// (kernels/ops/dense_stream.cu) and on the older kernels ("sweep": also forced stream plans), then
// (without an argument) wo_a and the compressor's linears at 256 and 1024 rows on the older tiled
// kernel, the automatic choice and each dense GEMM tile (kernels/ops/dense_gemm.cu), in µs and TFLOP/s
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/ops/gpu_buffer.h"
#include "dsv41/ops/gpu_ops.h"
#include "model/linears.h"
#include "gemm_dispatch.h"
#include "linear_inputs.h"
#include "ops/dense_gemm.h"
#include "ops/dense_stream.h"
#include "ops/lin8_tc_gemm.h"
#include "ops/lin8_tc_gemv.h"
#include "ops/lin_gemm.h"

namespace {

using namespace dsv41;
namespace gpu = dsv41::ops::gpu;
using gpu::DeviceBuffer;
using dsv41::test::QuantAct;

constexpr double kCopyGBs = 4300.0;
constexpr size_t kRotateBytes = size_t{512} << 20;  // weights touched across the rotation (> 10x L2)

int g_failures = 0;
cudaStream_t g_stream = nullptr;  // the stream every timed call runs on

// Fast deterministic filler (xorshift64*): gigabytes of random codes in well under a second.
struct Fast {
  uint64_t s;
  explicit Fast(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

std::vector<uint8_t> e4m3_bytes(size_t n, uint64_t seed) {  // no NaN codes
  std::vector<uint8_t> v(n);
  Fast f(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = f.next();
    for (size_t j = 0; j < 8 && i + j < n; ++j, r >>= 8) {
      uint8_t b = static_cast<uint8_t>(r);
      if ((b & 0x7F) == 0x7F) b ^= 1;
      v[i + j] = b;
    }
  }
  return v;
}
std::vector<uint8_t> raw_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  Fast f(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = f.next();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
  }
  return v;
}
std::vector<uint8_t> e8m0_bytes(size_t n, uint64_t seed) {  // 2^-9 .. 2^-1
  std::vector<uint8_t> v(n);
  Fast f(seed);
  for (auto& b : v) b = static_cast<uint8_t>(118 + f.below(9));
  return v;
}
std::vector<float> bf16_values(size_t n, uint64_t seed, int exp_lo = 120, int exp_span = 8) {
  std::vector<float> v(n);
  Fast f(seed);
  for (auto& x : v) {
    const uint64_t r = f.next();
    const uint32_t bits = (static_cast<uint32_t>(r & 1) << 31) |
                          (static_cast<uint32_t>(exp_lo + static_cast<int>((r >> 1) % exp_span)) << 23) |
                          (static_cast<uint32_t>((r >> 8) & 0x7F) << 16);
    std::memcpy(&x, &bits, 4);
  }
  return v;
}
std::vector<float> f32_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  Fast f(seed);
  for (auto& x : v) {
    const uint64_t r = f.next();
    const uint32_t bits = (static_cast<uint32_t>(r & 1) << 31) | (static_cast<uint32_t>(118 + (r >> 1) % 8) << 23) |
                          static_cast<uint32_t>((r >> 8) & 0x7FFFFF);
    std::memcpy(&x, &bits, 4);
  }
  return v;
}
std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    o[i] = static_cast<uint16_t>(u >> 16);  // values are bf16 already
  }
  return o;
}

struct TempDir {
  std::string dir;
  TempDir() {
    char tmpl[] = "/tmp/dsv41_bench_lin_XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    dir = d;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// Bitwise comparison of selected output rows; prints one line.
void check_rows(const std::string& what, const std::vector<float>& got_all, int64_t stride, int64_t col0,
                const std::vector<int64_t>& rows, const std::vector<float>& want, int64_t width) {
  size_t bad = 0, total = 0;
  double first_got = 0, first_want = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < width; ++c) {
      const float g = got_all[static_cast<size_t>(rows[i] * stride + col0 + c)], w = want[i * width + c];
      ++total;
      if (std::memcmp(&g, &w, 4) != 0) {
        if (!bad) first_got = g, first_want = w;
        ++bad;
      }
    }
  std::printf("  check %-40s %s (%zu/%zu bit-identical)", what.c_str(), bad ? "FAILED" : "ok", total - bad, total);
  if (bad) std::printf(" first: got %.9g want %.9g", first_got, first_want);
  std::printf("\n");
  if (bad) ++g_failures;
}

// Rows of an m-row call compared against the CPU: all of them when few, else the first 6 and the last.
std::vector<int64_t> checked_rows(int64_t m) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < std::min<int64_t>(m, 6); ++i) r.push_back(i);
  if (m > 6) r.push_back(m - 1);
  return r;
}

template <class F>
double time_calls(F call, int iters) {
  for (int i = 0; i < 3; ++i) call(i);
  cudaDeviceSynchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, g_stream);
  for (int i = 0; i < iters; ++i) call(i);
  cudaEventRecord(b, g_stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  gpu::check_cuda(cudaGetLastError(), "bench launches");
  return 1000.0 * ms / iters;
}

void report(const std::string& kernel, const std::string& shape, int64_t m, double us, double bytes) {
  const double gbs = bytes / (us * 1e3);
  std::printf("%-6s %-30s m=%-4lld %9.2f us/call %10.2f MB %8.1f GB/s %5.1f %% of copy\n", kernel.c_str(),
              shape.c_str(), static_cast<long long>(m), us, bytes / 1e6, gbs, 100.0 * gbs / kCopyGBs);
  std::fflush(stdout);
}

// ---- Lin8 -------------------------------------------------------------------------------------------
// A random out x in Lin8 weight: `copies` device copies, rotated through so that calls read DRAM
// rather than L2, and the same weight as the CPU engine's linear (the reference of every check).
struct Lin8Weight {
  int64_t in, out;
  size_t wbytes, sbytes;
  int copies;
  DeviceBuffer dw, ds;
  TempDir tmp;
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Linear> lin;
  Lin8Weight(int64_t in_, int64_t out_, int64_t salt = 0)
      : in(in_),
        out(out_),
        wbytes(static_cast<size_t>(in * out)),
        sbytes(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32))),
        copies(static_cast<int>(std::max<size_t>(1, (kRotateBytes + wbytes - 1) / wbytes))),
        dw(wbytes * copies),
        ds(sbytes * copies) {
    const std::vector<uint8_t> codes = e4m3_bytes(wbytes, in * 7 + out + salt);
    const std::vector<uint8_t> scales = e8m0_bytes(sbytes, in + out * 3 + salt);
    for (int c = 0; c < copies; ++c) {
      dw.upload(codes.data(), wbytes, wbytes * c);
      ds.upload(scales.data(), sbytes, sbytes * c);
    }
    SafetensorsWriter wr;
    wr.add("w.weight", DType::F8_E4M3, {out, in}, codes);
    wr.add("w.scale", DType::F8_E8M0, {(out + 31) / 32, (in + 31) / 32}, scales);
    wr.write(tmp.dir + "/w.safetensors");
    ck = Checkpoint::open(tmp.dir);
    lin = model::load_linear(*ck, "w", in, out);
  }
  // Device copy i % copies of the weight.
  gpu::Fp8Weight at(int i) const {
    const int c = i % copies;
    return {dw.as<uint8_t>() + wbytes * c, ds.as<uint8_t>() + sbytes * c, in, out};
  }
};

void bench_lin8(const std::string& name, int64_t in, int64_t out, const std::vector<int64_t>& ms, int iters) {
  const Lin8Weight wt(in, out);
  const size_t wbytes = wt.wbytes, sbytes = wt.sbytes;
  for (int64_t m : ms) {
    const std::vector<float> x = bf16_values(static_cast<size_t>(m * in), m * 31 + in, 124, 6);
    QuantAct qa(x, m, in);
    DeviceBuffer dy(static_cast<size_t>(m * out) * 4);
    gpu::Lin8Args a;
    a.x_codes = qa.codes.as<uint8_t>();
    a.x_scales = qa.scales.as<float>();
    a.m = m;
    a.y = dy.as<float>();
    a.y_stride = out;
    auto call = [&](int i) {
      a.w = wt.at(i);
      gpu::lin8(a, g_stream);
    };
    a.exact_block_sums = true;  // the bitwise CPU check needs the sequential block sums
    call(0);
    gpu::check_cuda(cudaDeviceSynchronize(), "lin8");
    const std::vector<int64_t> rows = checked_rows(m);
    std::vector<float> xs(rows.size() * in), want(rows.size() * out);
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&x[rows[i] * in], in, &xs[i * in]);
    model::linear_bf16(*wt.lin, xs.data(), static_cast<int64_t>(rows.size()), want.data());
    check_rows("lin8 " + name + " m=" + std::to_string(m), dy.to_host<float>(static_cast<size_t>(m * out)), out, 0,
               rows, want, out);
    const double lin8_bytes = double(wbytes + sbytes) + double(m * in) * 1.125 + double(m * out) * 4;
    // exact_block_sums next to the default dispatch, in the same process (the same kernel below the
    // tensor-core GEMM's row threshold; the model's prefill passes of that many rows take it)
    report("lin8", name + " " + std::to_string(out) + "x" + std::to_string(in) + " exact", m, time_calls(call, iters),
           lin8_bytes);
    a.exact_block_sums = false;  // the default dispatch (tensor-core block sums where taken)
    const double us = time_calls(call, iters);
    report("lin8", name + " " + std::to_string(out) + "x" + std::to_string(in), m, us, lin8_bytes);
    // a decode pass's call with the decode-size tensor-core kernel on (Lin8Args::row_invariant)
    a.row_invariant = true;
    const int was_on = gpu::raw::set_lin8_tc_gemv(1);
    report("lin8", name + " " + std::to_string(out) + "x" + std::to_string(in) + " row-invariant", m,
           time_calls(call, iters), lin8_bytes);
    gpu::raw::set_lin8_tc_gemv(was_on);
    a.row_invariant = false;
  }
}

// ---- Lin8 at prefill sizes: GEMM vs GEMV ----------------------------------------------------------------
constexpr double kFmaTflops = 67.0;  // H200 fp32 FMA ceiling: 132 SMs x 128 lanes x 2 flops x 1.98 GHz

// Forces the Lin8 GEMM dispatch threshold and CTA tile while in scope.
// Forces the Lin8 GEMM's threshold and tile while in scope (gemm_dispatch.h).
using GemmMode = test::ScopedGemmDispatch<&gpu::raw::set_lin8_gemm_min_rows, &gpu::raw::set_lin8_gemm_tile>;

constexpr int kGemmTiles = 5;  // forced CTA tiles of lin8_gemm (raw::set_lin8_gemm_tile)

// Forces the tensor-core Lin8 GEMM's threshold and tile while in scope.
using TcMode = test::ScopedGemmDispatch<&gpu::raw::set_lin8_tc_min_rows, &gpu::raw::set_lin8_tc_tile>;

void bench_lin8_gemm(const std::string& name, int64_t in, int64_t out, const std::vector<int64_t>& ms, int iters) {
  const Lin8Weight wt(in, out);
  const std::string shape = name + " " + std::to_string(out) + "x" + std::to_string(in);
  for (int64_t m : ms) {
    const std::vector<float> x = bf16_values(static_cast<size_t>(m * in), m * 31 + in, 124, 6);
    QuantAct qa(x, m, in);
    DeviceBuffer y_gemv(static_cast<size_t>(m * out) * 4), y_gemm(static_cast<size_t>(m * out) * 4);
    const DeviceBuffer rows16(static_cast<size_t>(gpu::lin8_rows16_bytes(m, in)));
    gpu::Lin8Args a;
    a.x_codes = qa.codes.as<uint8_t>();
    a.x_scales = qa.scales.as<float>();
    a.m = m;
    a.y_stride = out;
    auto call = [&](int i) {
      a.w = wt.at(i);
      gpu::lin8(a, g_stream);
    };
    const int n_it = std::max(3, static_cast<int>(iters * 256 / std::max<int64_t>(m, 256)));
    const double flops = 2.0 * double(m) * double(in) * double(out);
    auto line = [&](const std::string& path, double us) {
      const double tf = flops / (us * 1e6);
      std::printf("gemm   %-30s m=%-5lld %-9s %9.2f us/call %7.2f TFLOP/s %5.1f %% of fp32 FMA\n", shape.c_str(),
                  static_cast<long long>(m), path.c_str(), us, tf, 100.0 * tf / kFmaTflops);
      std::fflush(stdout);
    };
    double us_gemv;
    a.exact_block_sums = true;  // the sequential kernels: the GEMV and the CUDA-core GEMM tiles
    {
      GemmMode mode(std::numeric_limits<int64_t>::max(), 0);
      a.y = y_gemv.as<float>();
      call(0);
      gpu::check_cuda(cudaDeviceSynchronize(), "lin8 gemv");
      us_gemv = time_calls(call, n_it);
    }
    // the GEMV kernel against the CPU on some rows, every forced GEMM tile against it on all outputs
    const std::vector<float> ref = y_gemv.to_host<float>(static_cast<size_t>(m * out));
    const std::vector<int64_t> rows = checked_rows(m);
    std::vector<float> xs(rows.size() * in), want(rows.size() * out);
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&x[rows[i] * in], in, &xs[i * in]);
    model::linear_bf16(*wt.lin, xs.data(), static_cast<int64_t>(rows.size()), want.data());
    check_rows("lin8 gemv " + name + " m=" + std::to_string(m), ref, out, 0, rows, want, out);
    size_t bad = 0;
    for (int tile = 1; tile <= kGemmTiles; ++tile) {
      GemmMode mode(1, tile);
      a.y = y_gemm.as<float>();
      gpu::check_cuda(cudaMemset(y_gemm.get(), 0xFF, static_cast<size_t>(m * out) * 4), "poison");
      call(0);
      gpu::check_cuda(cudaDeviceSynchronize(), "lin8 gemm");
      const std::vector<float> got = y_gemm.to_host<float>(static_cast<size_t>(m * out));
      for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &ref[i], 4) != 0;
    }
    std::printf("  check %-40s %s (%zu of %d x %zu outputs differ from the GEMV kernel)\n",
                ("lin8 gemm tiles " + name + " m=" + std::to_string(m)).c_str(), bad ? "FAILED" : "ok", bad, kGemmTiles,
                ref.size());
    if (bad) ++g_failures;
    line("gemv", us_gemv);
    for (int tile = 1; tile <= kGemmTiles; ++tile) {
      GemmMode mode(1, tile);
      static const char* const kNames[] = {"", "64x64", "128x64", "128x128", "64x64/k4", "32x64/k8"};
      line(kNames[tile], time_calls(call, n_it));
    }
    {  // the default dispatch of exact_block_sums calls: GEMM (tile by the time model) or GEMV
      GemmMode mode(gpu::raw::kLin8GemmMinRows, 0);
      line("exact", time_calls(call, n_it));
    }
    // the tensor-core GEMM (calls without exact_block_sums), each tile: outputs equal to the
    // sequential sums where the block sums fit in 24 bits, else within a rounding of a block sum
    a.exact_block_sums = false;
    for (int tile = 1; tile <= gpu::raw::kLin8TcTiles; ++tile) {
      TcMode mode(1, tile);
      a.y = y_gemm.as<float>();
      gpu::check_cuda(cudaMemset(y_gemm.get(), 0xFF, static_cast<size_t>(m * out) * 4), "poison");
      call(0);
      gpu::check_cuda(cudaDeviceSynchronize(), "lin8 tc gemm");
      const std::vector<float> got = y_gemm.to_host<float>(static_cast<size_t>(m * out));
      // differences relative to the largest output (single outputs may cancel to near zero); on
      // these full-range random codes up to ~3e-3 was measured on H200, a wrong index or scale
      // gives differences of the order of the outputs (the derived bound: lin8_tc_gemm_test)
      size_t same = 0, nonfinite = 0;
      double worst = 0.0, largest = 0.0;
      for (float v : ref) largest = std::max(largest, std::fabs(double(v)));
      for (size_t i = 0; i < got.size(); ++i) {
        same += std::memcmp(&got[i], &ref[i], 4) == 0;
        if (!std::isfinite(got[i])) ++nonfinite;
        else worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
      }
      worst /= std::max(largest, 1e-30);
      const bool tc_bad = nonfinite != 0 || worst > 1e-2;
      std::printf("  check %-40s %s (%zu/%zu equal to the sequential sums, worst difference %.2e of the largest output)\n",
                  ("lin8 tc tile " + std::to_string(tile) + " " + name + " m=" + std::to_string(m)).c_str(),
                  tc_bad ? "FAILED" : "ok", same, got.size(), worst);
      if (tc_bad) ++g_failures;
      static const char* const kTcNames[] = {"", "tc128x128", "tc64x64"};
      const std::string tc_name = tile < 3 ? kTcNames[tile] : "tc";
      line(tc_name, time_calls(call, n_it));
      // the scaled path (Lin8Args::rows16) folding its blocks one by one: the same bits, timed
      a.rows16 = rows16.get();
      a.rows16_bytes = static_cast<int64_t>(rows16.bytes());
      a.block_fold = true;
      gpu::check_cuda(cudaMemset(y_gemm.get(), 0xFF, static_cast<size_t>(m * out) * 4), "poison");
      call(0);
      gpu::check_cuda(cudaDeviceSynchronize(), "lin8 tc gemm, scaled path");
      const std::vector<float> scaled = y_gemm.to_host<float>(static_cast<size_t>(m * out));
      const bool differ = std::memcmp(scaled.data(), got.data(), got.size() * 4) != 0;
      std::printf("  check %-40s %s (the scaled path against the codes path, bit for bit)\n",
                  ("lin8 tc tile " + std::to_string(tile) + " scaled " + name + " m=" + std::to_string(m)).c_str(),
                  differ ? "FAILED" : "ok");
      if (differ) ++g_failures;
      line(tc_name + "/s", time_calls(call, n_it));
      // its default, as the engine calls it: whole-K sums (Lin8Args::block_fold off), held to the
      // same closeness to the sequential sums as the codes path
      a.block_fold = false;
      gpu::check_cuda(cudaMemset(y_gemm.get(), 0xFF, static_cast<size_t>(m * out) * 4), "poison");
      call(0);
      gpu::check_cuda(cudaDeviceSynchronize(), "lin8 tc gemm, whole K");
      const std::vector<float> whole = y_gemm.to_host<float>(static_cast<size_t>(m * out));
      size_t wk_same = 0, wk_fold_same = 0, wk_nonfinite = 0;
      double wk_worst = 0.0;
      for (size_t i = 0; i < whole.size(); ++i) {
        wk_same += std::memcmp(&whole[i], &ref[i], 4) == 0;
        wk_fold_same += std::memcmp(&whole[i], &got[i], 4) == 0;
        if (!std::isfinite(whole[i])) ++wk_nonfinite;
        else wk_worst = std::max(wk_worst, std::fabs(double(whole[i]) - ref[i]));
      }
      wk_worst /= std::max(largest, 1e-30);
      const bool wk_bad = wk_nonfinite != 0 || wk_worst > 1e-2;
      std::printf("  check %-40s %s (%zu/%zu equal to the sequential sums, %zu to the block fold, worst difference "
                  "%.2e of the largest output)\n",
                  ("lin8 tc tile " + std::to_string(tile) + " whole-K " + name + " m=" + std::to_string(m)).c_str(),
                  wk_bad ? "FAILED" : "ok", wk_same, whole.size(), wk_fold_same, wk_worst);
      if (wk_bad) ++g_failures;
      line(tc_name + "/wk", time_calls(call, n_it));
      a.rows16 = nullptr;
      a.rows16_bytes = 0;
    }
    {  // the default dispatch of calls without exact_block_sums, codes path then scaled path
      GemmMode mode(gpu::raw::kLin8GemmMinRows, 0);
      TcMode tc(gpu::raw::kLin8TcMinRows, 0);
      line("dispatch", time_calls(call, n_it));
      a.rows16 = rows16.get();
      a.rows16_bytes = static_cast<int64_t>(rows16.bytes());
      a.block_fold = true;
      line("dispatch/s", time_calls(call, n_it));
      a.block_fold = false;
      line("dispatch/wk", time_calls(call, n_it));
      a.rows16 = nullptr;
      a.rows16_bytes = 0;
    }
  }
}

// ---- grouped Lin8 pairs ---------------------------------------------------------------------------------
// Two linears over the same input codes: two lin8 calls vs one lin8_group launch (bit-identical
// outputs required; the separate calls are checked against the CPU in bench_lin8).
void bench_lin8_pair(const std::string& name, int64_t in, int64_t out1, int64_t out2, const std::vector<int64_t>& ms,
                     int iters) {
  const int64_t outs[2] = {out1, out2};
  const Lin8Weight w0(in, out1, 0), w1(in, out2, 1);
  const Lin8Weight* wts[2] = {&w0, &w1};
  for (int64_t m : ms) {
    const std::vector<float> x = bf16_values(static_cast<size_t>(m * in), m * 31 + in, 124, 6);
    QuantAct qa(x, m, in);
    DeviceBuffer y_sep[2] = {DeviceBuffer(static_cast<size_t>(m * out1) * 4), DeviceBuffer(static_cast<size_t>(m * out2) * 4)};
    DeviceBuffer y_grp[2] = {DeviceBuffer(static_cast<size_t>(m * out1) * 4), DeviceBuffer(static_cast<size_t>(m * out2) * 4)};
    gpu::Lin8GroupArgs g;
    g.count = 2;
    for (int p = 0; p < 2; ++p) {
      g.lin[p].x_codes = qa.codes.as<uint8_t>();
      g.lin[p].x_scales = qa.scales.as<float>();
      g.lin[p].m = m;
      g.lin[p].y_stride = outs[p];
    }
    auto set = [&](int i, DeviceBuffer* ys) {
      for (int p = 0; p < 2; ++p) {
        g.lin[p].w = wts[p]->at(i);
        g.lin[p].y = ys[p].as<float>();
      }
    };
    auto separate = [&](int i) {
      set(i, y_sep);
      gpu::lin8(g.lin[0], g_stream);
      gpu::lin8(g.lin[1], g_stream);
    };
    auto grouped = [&](int i) {
      set(i, y_grp);
      gpu::lin8_group(g, g_stream);
    };
    separate(0);
    grouped(0);
    gpu::check_cuda(cudaDeviceSynchronize(), "lin8 pair");
    size_t bad = 0, total = 0;
    for (int p = 0; p < 2; ++p) {
      const std::vector<float> a = y_sep[p].to_host<float>(static_cast<size_t>(m * outs[p]));
      const std::vector<float> b = y_grp[p].to_host<float>(static_cast<size_t>(m * outs[p]));
      for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
      total += a.size();
    }
    std::printf("  check %-40s %s (%zu/%zu bit-identical to separate calls)\n", ("lin8 pair " + name + " m=" + std::to_string(m)).c_str(),
                bad ? "FAILED" : "ok", total - bad, total);
    if (bad) ++g_failures;
    const double bytes = double(w0.wbytes + w1.wbytes + w0.sbytes + w1.sbytes) + double(m * in) * 1.125 +
                         double(m * (out1 + out2)) * 4;
    const std::string shape = name + " " + std::to_string(out1) + "+" + std::to_string(out2) + "x" + std::to_string(in);
    report("lin8x2", shape + " separate", m, time_calls(separate, iters), bytes);
    report("lin8x2", shape + " grouped", m, time_calls(grouped, iters), bytes);
    for (int p = 0; p < 2; ++p) g.lin[p].row_invariant = true;  // a decode pass's call, kernel on
    const int was_on = gpu::raw::set_lin8_tc_gemv(1);
    report("lin8x2", shape + " grouped row-invariant", m, time_calls(grouped, iters), bytes);
    gpu::raw::set_lin8_tc_gemv(was_on);
    for (int p = 0; p < 2; ++p) g.lin[p].row_invariant = false;
  }
}

// ---- Lin4 expert bank ---------------------------------------------------------------------------------
// The routed experts of n_tok tokens: top_k distinct experts per token (as the router picks them),
// drawn afresh for every call so that consecutive calls read other experts.
std::vector<int32_t> route(int64_t n_tok, int64_t top_k, int64_t n_experts, Fast& f) {
  std::vector<int32_t> ids(static_cast<size_t>(n_tok * top_k));
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      int32_t e;
      bool dup;
      do {
        e = static_cast<int32_t>(f.below(n_experts));
        dup = false;
        for (int64_t j = 0; j < k; ++j) dup |= ids[t * top_k + j] == e;
      } while (dup);
      ids[t * top_k + k] = e;
    }
  return ids;
}

void bench_lin4(const std::string& name, int64_t in, int64_t out, int64_t n_experts, int64_t top_k, bool gate_up,
                const std::vector<int64_t>& ms, int iters) {
  const int64_t nb = in / 32;
  const size_t pbytes = static_cast<size_t>(out * in / 2), sbytes = static_cast<size_t>(out * nb);
  DeviceBuffer dp(pbytes * n_experts), ds(sbytes * n_experts);
  // Experts are the same random tensor with a per-expert byte offset pattern: distinct contents,
  // cheap to make.
  const std::vector<uint8_t> packed = raw_bytes(pbytes, in + out);
  const std::vector<uint8_t> scales = e8m0_bytes(sbytes, in * 5 + out);
  std::vector<uint8_t> pe(pbytes), se(sbytes);
  auto expert_bytes = [&](int64_t e) {
    for (size_t i = 0; i < pbytes; ++i) pe[i] = static_cast<uint8_t>(packed[i] + 37 * e);
    for (size_t i = 0; i < sbytes; ++i) se[i] = static_cast<uint8_t>(118 + (scales[i] - 118 + e) % 9);
  };
  for (int64_t e = 0; e < n_experts; ++e) {
    expert_bytes(e);
    dp.upload(pe.data(), pbytes, pbytes * e);
    ds.upload(se.data(), sbytes, sbytes * e);
  }
  Fast f(static_cast<uint64_t>(in * 11 + out));
  for (int64_t m : ms) {
    const int64_t rows = m * top_k, x_rows = gate_up ? m : rows;
    std::vector<int32_t> all_ids;
    const int n_sets = iters + 3;
    for (int i = 0; i < n_sets; ++i) {
      const std::vector<int32_t> ids = route(m, top_k, n_experts, f);
      all_ids.insert(all_ids.end(), ids.begin(), ids.end());
    }
    DeviceBuffer dids = DeviceBuffer::from(all_ids);
    const std::vector<float> x = bf16_values(static_cast<size_t>(x_rows * in), m * 13 + in, 124, 6);
    QuantAct qa(x, x_rows, in);
    DeviceBuffer dy(static_cast<size_t>(rows * out) * 4);
    gpu::Lin4Args a;
    a.w = {dp.as<uint8_t>(), ds.as<uint8_t>(), in, out, n_experts};
    a.x_codes = qa.codes.as<uint8_t>();
    a.x_scales = qa.scales.as<float>();
    a.rows = rows;
    a.x_row_div = gate_up ? top_k : 1;
    a.y = dy.as<float>();
    a.y_stride = out;
    auto call = [&](int i) {
      a.expert_ids = dids.as<int32_t>() + static_cast<int64_t>(i % n_sets) * rows;
      gpu::lin4(a, g_stream);
    };
    call(0);
    gpu::check_cuda(cudaDeviceSynchronize(), "lin4");
    {  // CPU reference of the checked rows, through a checkpoint of the experts they use
      const std::vector<int64_t> crow = checked_rows(rows);
      TempDir tmp;
      SafetensorsWriter wr;
      std::vector<std::vector<uint8_t>> keep;
      std::vector<int32_t> used;
      for (int64_t r : crow) used.push_back(all_ids[static_cast<size_t>(r)]);
      std::sort(used.begin(), used.end());
      used.erase(std::unique(used.begin(), used.end()), used.end());
      for (int32_t e : used) {
        expert_bytes(e);
        keep.push_back(pe);
        keep.push_back(se);
        const std::string p = "e" + std::to_string(e);
        wr.add(p + ".weight", DType::I8, {out, in / 2}, keep[keep.size() - 2]);
        wr.add(p + ".scale", DType::F8_E8M0, {out, nb}, keep.back());
      }
      wr.write(tmp.dir + "/w.safetensors");
      auto ck = Checkpoint::open(tmp.dir);
      std::vector<float> want(crow.size() * out);
      for (size_t i = 0; i < crow.size(); ++i) {
        const int32_t e = all_ids[static_cast<size_t>(crow[i])];
        auto lin = model::load_linear(*ck, "e" + std::to_string(e), in, out);
        const int64_t xr = gate_up ? crow[i] / top_k : crow[i];
        model::linear_bf16(*lin, &x[xr * in], 1, &want[i * out]);
      }
      check_rows("lin4 " + name + " m=" + std::to_string(m), dy.to_host<float>(static_cast<size_t>(rows * out)), out, 0,
                 crow, want, out);
    }
    const double us = time_calls(call, iters);
    // bytes: the distinct experts of one call (averaged over the timed calls)
    double distinct = 0;
    for (int i = 0; i < iters; ++i) {
      std::vector<int32_t> s(all_ids.begin() + static_cast<int64_t>(i % n_sets) * rows,
                             all_ids.begin() + static_cast<int64_t>(i % n_sets + 1) * rows);
      std::sort(s.begin(), s.end());
      distinct += static_cast<double>(std::unique(s.begin(), s.end()) - s.begin());
    }
    distinct /= iters;
    const double lin4_bytes = distinct * double(pbytes + sbytes) + double(x_rows * in) * 1.125 + double(rows * out) * 4;
    report("lin4", name + " " + std::to_string(out) + "x" + std::to_string(in), m, us, lin4_bytes);
  }
}

// ---- grouped Lin4 gate/up banks -----------------------------------------------------------------------
// w1 and w3 banks of the same experts over the same token codes: two lin4 calls vs one lin4_group.
void bench_lin4_pair(const std::string& name, int64_t in, int64_t out, int64_t n_experts, int64_t top_k,
                     const std::vector<int64_t>& ms, int iters) {
  const int64_t nb = in / 32;
  const size_t pbytes = static_cast<size_t>(out * in / 2), sbytes = static_cast<size_t>(out * nb);
  std::vector<DeviceBuffer> dp, ds;
  for (int b = 0; b < 2; ++b) {
    const std::vector<uint8_t> packed = raw_bytes(pbytes, in + out + 101 * b);
    const std::vector<uint8_t> scales = e8m0_bytes(sbytes, in * 5 + out + b);
    dp.emplace_back(pbytes * n_experts);
    ds.emplace_back(sbytes * n_experts);
    std::vector<uint8_t> pe(pbytes), se(sbytes);
    for (int64_t e = 0; e < n_experts; ++e) {
      for (size_t i = 0; i < pbytes; ++i) pe[i] = static_cast<uint8_t>(packed[i] + 37 * e);
      for (size_t i = 0; i < sbytes; ++i) se[i] = static_cast<uint8_t>(118 + (scales[i] - 118 + e) % 9);
      dp[b].upload(pe.data(), pbytes, pbytes * e);
      ds[b].upload(se.data(), sbytes, sbytes * e);
    }
  }
  Fast f(static_cast<uint64_t>(in * 13 + out));
  for (int64_t m : ms) {
    const int64_t rows = m * top_k;
    std::vector<int32_t> all_ids;
    const int n_sets = iters + 3;
    for (int i = 0; i < n_sets; ++i) {
      const std::vector<int32_t> ids = route(m, top_k, n_experts, f);
      all_ids.insert(all_ids.end(), ids.begin(), ids.end());
    }
    DeviceBuffer dids = DeviceBuffer::from(all_ids);
    const std::vector<float> x = bf16_values(static_cast<size_t>(m * in), m * 13 + in, 124, 6);
    QuantAct qa(x, m, in);
    DeviceBuffer y_sep[2] = {DeviceBuffer(static_cast<size_t>(rows * out) * 4), DeviceBuffer(static_cast<size_t>(rows * out) * 4)};
    DeviceBuffer y_grp[2] = {DeviceBuffer(static_cast<size_t>(rows * out) * 4), DeviceBuffer(static_cast<size_t>(rows * out) * 4)};
    gpu::Lin4GroupArgs g;
    g.count = 2;
    for (int b = 0; b < 2; ++b) {
      gpu::Lin4Args& a = g.lin[b];
      a.w = {dp[b].as<uint8_t>(), ds[b].as<uint8_t>(), in, out, n_experts};
      a.x_codes = qa.codes.as<uint8_t>();
      a.x_scales = qa.scales.as<float>();
      a.rows = rows;
      a.x_row_div = top_k;
      a.y_stride = out;
    }
    auto set = [&](int i, DeviceBuffer* ys) {
      for (int b = 0; b < 2; ++b) {
        g.lin[b].expert_ids = dids.as<int32_t>() + static_cast<int64_t>(i % n_sets) * rows;
        g.lin[b].y = ys[b].as<float>();
      }
    };
    auto separate = [&](int i) {
      set(i, y_sep);
      gpu::lin4(g.lin[0], g_stream);
      gpu::lin4(g.lin[1], g_stream);
    };
    auto grouped = [&](int i) {
      set(i, y_grp);
      gpu::lin4_group(g, g_stream);
    };
    separate(0);
    grouped(0);
    gpu::check_cuda(cudaDeviceSynchronize(), "lin4 pair");
    size_t bad = 0, total = 0;
    for (int b = 0; b < 2; ++b) {
      const std::vector<float> u = y_sep[b].to_host<float>(static_cast<size_t>(rows * out));
      const std::vector<float> v = y_grp[b].to_host<float>(static_cast<size_t>(rows * out));
      for (size_t i = 0; i < u.size(); ++i) bad += std::memcmp(&u[i], &v[i], 4) != 0;
      total += u.size();
    }
    std::printf("  check %-40s %s (%zu/%zu bit-identical to separate calls)\n", ("lin4 pair " + name + " m=" + std::to_string(m)).c_str(),
                bad ? "FAILED" : "ok", total - bad, total);
    if (bad) ++g_failures;
    // distinct experts read per call (about rows of them at decode sizes), both banks
    const double distinct = static_cast<double>(std::min<int64_t>(rows, n_experts));
    const double bytes = 2 * distinct * double(pbytes + sbytes) + double(m * in) * 1.125 + double(2 * rows * out) * 4;
    const std::string shape = name + " 2x" + std::to_string(out) + "x" + std::to_string(in);
    report("lin4x2", shape + " separate", m, time_calls(separate, iters), bytes);
    report("lin4x2", shape + " grouped", m, time_calls(grouped, iters), bytes);
  }
}

// ---- dense ------------------------------------------------------------------------------------------
// One way to run the dense calls: the streaming kernel's mode (0 = automatic, 1 = off: the older
// kernels) and a forced plan (rows per tile, stages, CTAs per SM; 0 = chosen per call), see
// kernels/ops/dense_stream.h. Applied while in scope.
struct DenseVariant {
  const char* label;
  int mode, rows, stages, ctas_per_sm;
};
struct DenseVariantScope {
  int mode, rows, stages, cps;
  explicit DenseVariantScope(const DenseVariant& v)
      : mode(gpu::raw::set_dense_stream_mode(v.mode)),
        rows(gpu::raw::set_dense_stream_rows_per_tile(v.rows)),
        stages(gpu::raw::set_dense_stream_stages(v.stages)),
        cps(gpu::raw::set_dense_stream_ctas_per_sm(v.ctas_per_sm)) {}
  ~DenseVariantScope() {
    gpu::raw::set_dense_stream_mode(mode);
    gpu::raw::set_dense_stream_rows_per_tile(rows);
    gpu::raw::set_dense_stream_stages(stages);
    gpu::raw::set_dense_stream_ctas_per_sm(cps);
  }
};

void bench_dense(const std::string& name, gpu::DenseType wt, int64_t in, int64_t out, int64_t groups, bool round,
                 const std::vector<int64_t>& ms, int iters, int64_t check_outputs,
                 const std::vector<DenseVariant>& variants = {{"", 0, 0, 0, 0}}) {
  const bool bf = wt == gpu::DenseType::BF16;
  const int64_t esize = bf ? 2 : 4;
  const size_t wbytes = static_cast<size_t>(groups * out * in * esize);
  const int copies = static_cast<int>(std::max<size_t>(1, (kRotateBytes + wbytes - 1) / wbytes));
  std::vector<float> wv = bf ? bf16_values(static_cast<size_t>(groups * out * in), in + out, 118, 8)
                             : f32_values(static_cast<size_t>(groups * out * in), in + out);
  DeviceBuffer dw(wbytes * copies);
  {
    std::vector<uint8_t> host(wbytes);
    if (bf) {
      const std::vector<uint16_t> b = bf16_bits(wv);
      std::memcpy(host.data(), b.data(), wbytes);
    } else {
      std::memcpy(host.data(), wv.data(), wbytes);
    }
    for (int c = 0; c < copies; ++c) dw.upload(host.data(), wbytes, wbytes * c);
  }
  // CPU reference over the first check_outputs outputs of every group
  const int64_t co = std::min(check_outputs, out);
  std::vector<std::unique_ptr<Linear>> lins;
  for (int64_t g = 0; g < groups; ++g)
    lins.push_back(model::make_dense_linear(
        std::vector<float>(wv.begin() + g * out * in, wv.begin() + (g * out + co) * in), in, co));
  wv.clear();
  wv.shrink_to_fit();
  for (int64_t m : ms) {
    const std::vector<float> x = bf16_values(static_cast<size_t>(m * groups * in), m * 17 + in, 124, 6);
    DeviceBuffer dx = DeviceBuffer::from(x), dy(static_cast<size_t>(m * groups * out) * 4);
    gpu::DenseArgs a;
    a.wt = wt;
    a.in = in;
    a.out = out;
    a.groups = groups;
    a.x = dx.as<float>();
    a.x_stride = groups * in;
    a.m = m;
    a.y = dy.as<float>();
    a.y_stride = groups * out;
    a.round_bf16 = round;
    auto call = [&](int i) {
      a.w = dw.as<uint8_t>() + wbytes * (i % copies);
      gpu::lin_dense(a, g_stream);
    };
    // the CPU reference of the checked rows (the same for every variant)
    const std::vector<int64_t> rows = checked_rows(m);
    std::vector<std::vector<float>> wants(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<float> xs(rows.size() * in);
      wants[g].resize(rows.size() * co);
      for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&x[(rows[i] * groups + g) * in], in, &xs[i * in]);
      if (round) model::linear_bf16(*lins[g], xs.data(), static_cast<int64_t>(rows.size()), wants[g].data());
      else lins[g]->forward(xs.data(), static_cast<int64_t>(rows.size()), wants[g].data());
    }
    for (const DenseVariant& v : variants) {
      DenseVariantScope scope(v);
      const std::string label = name + (v.label[0] ? std::string(" ") + v.label : std::string());
      a.w = dw.get();
      gpu::raw::DenseStreamPlan plan;
      if (v.mode != 1 && gpu::raw::dense_stream_takes(a) && gpu::raw::dense_stream_plan(a, &plan))
        std::printf("       %-30s m=%-4lld stream plan: %d rows/tile, %d stages, %lld CTAs of %d threads, %zu KB smem\n",
                    label.c_str(), static_cast<long long>(m), plan.rows_per_tile, plan.stages,
                    static_cast<long long>(plan.ctas), plan.threads, plan.smem / 1024);
      gpu::check_cuda(cudaMemset(dy.get(), 0xff, static_cast<size_t>(m * groups * out) * 4), "poison");
      call(0);
      gpu::check_cuda(cudaDeviceSynchronize(), "lin_dense");
      const std::vector<float> got = dy.to_host<float>(static_cast<size_t>(m * groups * out));
      for (int64_t g = 0; g < groups; ++g)
        check_rows("dense " + label + " g" + std::to_string(g) + " m=" + std::to_string(m), got, groups * out, g * out,
                   rows, wants[g], co);
      const double us = time_calls(call, iters);
      report(bf ? "bf16" : "f32", label + " " + std::to_string(groups) + "x" + std::to_string(out) + "x" + std::to_string(in),
             m, us, double(wbytes) + double(m * groups * in) * 4 + double(m * groups * out) * 4);
      const double tflops = 2.0 * double(m) * double(groups * out) * double(in) / (us * 1e6);
      std::printf("       %-30s m=%-4lld %9.2f TFLOP/s %5.1f %% of the fp32 FMA ceiling (%.0f TFLOP/s)\n", label.c_str(),
                  static_cast<long long>(m), tflops, 100.0 * tflops / kFmaTflops, kFmaTflops);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  // --pairs: only the linears that share an input, as two calls and as one grouped launch
  const bool pairs_only = argc > 1 && std::string(argv[1]) == "--pairs";
  const bool gemm_only = argc > 1 && std::string(argv[1]) == "--gemm";
  // --dense: the prefill dense linears (wo_a, the compressor) at 256 and 1024 rows, per kernel
  const bool dense_only = argc > 1 && std::string(argv[1]) == "--dense";
  // --decode: the block-scaled linears at decode sizes (m = 1, 2, 4)
  const bool decode_only = argc > 1 && std::string(argv[1]) == "--decode";
  try {
    const ModelConfig c = load_model_config(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("device %s, %d SMs; copy ceiling %.0f GB/s\n", prop.name, prop.multiProcessorCount, kCopyGBs);
    gpu::check_cuda(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "stream");
    const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 256};
    const std::vector<int64_t> ms_decode = quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4};
    const int it = quick ? 10 : 30;
    const int64_t dim = c.hidden_size, qlr = c.q_lora_rank, hd = c.head_dim, H = c.num_attention_heads;
    const int64_t inter = c.moe_intermediate_size, K = c.num_experts_per_tok, E = c.n_routed_experts;

    if (dense_only) {
      // decode sizes (m = 1, 2, 4): the streaming kernel's automatic plan against the older
      // kernels; "--dense sweep" adds forced plans, "--dense decode" skips the prefill part
      const std::string part = argc > 2 ? argv[2] : "";
      if (!part.empty() && part != "decode" && part != "sweep")
        throw std::runtime_error("--dense: expected decode or sweep, got " + part);
      const std::vector<int64_t> m_dec = {1, 2, 4};
      const std::vector<DenseVariant> base = {{"stream", 0, 0, 0, 0}, {"older", 1, 0, 0, 0}};
      std::vector<DenseVariant> one_wave = base, streamed = base;
      if (part == "sweep") {
        for (const DenseVariant& v : std::initializer_list<DenseVariant>{
                 {"r1s1", 0, 1, 1, 0}, {"r2s1", 0, 2, 1, 0}, {"r4s1", 0, 4, 1, 0}, {"r8s1", 0, 8, 1, 0},
                 {"r1s2", 0, 1, 2, 0}, {"r2s2", 0, 2, 2, 0}})
          one_wave.push_back(v);
        for (const DenseVariant& v : std::initializer_list<DenseVariant>{
                 {"r16s2", 0, 16, 2, 0}, {"r8s2", 0, 8, 2, 0}, {"r8s3", 0, 8, 3, 0}, {"r4s2", 0, 4, 2, 0},
                 {"r4s3", 0, 4, 3, 0}, {"r4s4", 0, 4, 4, 0}, {"r4s2c2", 0, 4, 2, 2}, {"r2s4c2", 0, 2, 4, 2},
                 {"r2s3c3", 0, 2, 3, 3}})
          streamed.push_back(v);
      }
      const int64_t ihd = c.index_head_dim;
      bench_dense("compressor", gpu::DenseType::F32, dim, hd, 1, false, m_dec, 30, hd, one_wave);
      bench_dense("index wk", gpu::DenseType::BF16, hd, ihd, 1, true, m_dec, 30, ihd, one_wave);
      bench_dense("weights_proj", gpu::DenseType::BF16, dim, c.index_n_heads, 1, true, m_dec, 30, c.index_n_heads,
                  one_wave);
      bench_dense("wo_a", gpu::DenseType::BF16, H * hd / c.o_groups, c.o_lora_rank, c.o_groups, true, m_dec, 30, 256,
                  streamed);
      bench_dense("head", gpu::DenseType::BF16, dim, c.vocab_size, 1, false, m_dec, 10, 1024, streamed);
      if (!part.empty()) {
        std::printf("comparisons failed: %d\n", g_failures);
        return g_failures ? 1 : 0;
      }
      // the prefill dense linears on the older tiled kernel, the automatic choice and each GEMM tile
      const std::vector<int64_t> md = {256, 1024};
      struct Mode {
        const char* name;
        int64_t min_rows;
        int tile;
      };
      const Mode modes[] = {{"older kernel", std::numeric_limits<int64_t>::max(), 0},
                            {"automatic", gpu::raw::kDenseGemmMinRows, 0},
                            {"gemm 64x64", 1, 1},
                            {"gemm 128x128", 1, 2}};
      for (const Mode& mode : modes) {
        std::printf("-- dense: %s\n", mode.name);
        const test::ScopedGemmDispatch<&gpu::raw::set_dense_gemm_min_rows, &gpu::raw::set_dense_gemm_tile> scoped(
            mode.min_rows, mode.tile);
        bench_dense("wo_a", gpu::DenseType::BF16, H * hd / c.o_groups, c.o_lora_rank, c.o_groups, true, md, 10, 256);
        bench_dense("compressor", gpu::DenseType::F32, dim, hd, 1, false, md, 10, hd);
        bench_dense("compressor r1", gpu::DenseType::BF16, dim, hd, 1, true, md, 10, hd);
      }
      std::printf("comparisons failed: %d\n", g_failures);
      return g_failures ? 1 : 0;
    }
    if (gemm_only) {
      // --gemm [m,m,...]: the row counts (default 16,32,64,256,1024)
      std::vector<int64_t> mg = {16, 32, 64, 256, 1024};
      if (argc > 2) {
        mg.clear();
        for (const char* p = argv[2]; *p;) {
          char* end = nullptr;
          const long long v = std::strtoll(p, &end, 10);
          if (end == p || v < 1) throw std::runtime_error("--gemm: bad row count list " + std::string(argv[2]));
          mg.push_back(v);
          p = *end == ',' ? end + 1 : end;
          if (*end != ',' && *end != 0) throw std::runtime_error("--gemm: bad row count list " + std::string(argv[2]));
        }
      }
      bench_lin8_gemm("wq_b", qlr, H * hd, mg, 10);
      bench_lin8_gemm("wo_b", c.o_groups * c.o_lora_rank, dim, mg, 10);
      bench_lin8_gemm("wq_a", dim, qlr, mg, 10);
      bench_lin8_gemm("wkv", dim, hd, mg, 10);
      bench_lin8_gemm("shared w1", dim, inter, mg, 10);
      bench_lin8_gemm("shared w2", inter, dim, mg, 10);
      bench_lin8_gemm("index wq_b", qlr, c.index_n_heads * c.index_head_dim, mg, 10);
      bench_lin8_gemm("engram wkv", c.n_engram_columns() * c.engram_head_dim, dim * (c.hc_mult + 1), mg, 10);
      std::printf("comparisons failed: %d\n", g_failures);
      return g_failures ? 1 : 0;
    }
    if (decode_only) {
      bench_lin4_pair("w1+w3", dim, inter, E, K, ms_decode, it);
      bench_lin8_pair("wq_a+wkv", dim, qlr, hd, ms_decode, it);
      bench_lin8_pair("shared w1+w3", dim, inter, inter, ms_decode, it);
      bench_lin4("gate/up", dim, inter, E, K, true, ms_decode, it);
      bench_lin4("down", inter, dim, E, K, false, ms_decode, it);
      bench_lin8("wq_a", dim, qlr, ms_decode, it);
      bench_lin8("wq_b", qlr, H * hd, ms_decode, it);
      bench_lin8("wo_b", c.o_groups * c.o_lora_rank, dim, ms_decode, it);
      bench_lin8("shared w1", dim, inter, ms_decode, it);
      bench_lin8("shared w2", inter, dim, ms_decode, it);
      std::printf("comparisons failed: %d\n", g_failures);
      return g_failures ? 1 : 0;
    }
    bench_lin4_pair("w1+w3", dim, inter, E, K, ms_decode, it);
    bench_lin8_pair("wq_a+wkv", dim, qlr, hd, ms, it);
    bench_lin8_pair("shared w1+w3", dim, inter, inter, ms, it);
    bench_lin8_pair("wq_b+index wq_b", qlr, H * hd, c.index_n_heads * c.index_head_dim, ms, it);
    if (pairs_only) {
      std::printf("comparisons failed: %d\n", g_failures);
      return g_failures ? 1 : 0;
    }
    bench_lin4("gate/up", dim, inter, E, K, true, ms, it);
    bench_lin4("down", inter, dim, E, K, false, ms, it);

    bench_lin8("wq_a", dim, qlr, ms, it);
    bench_lin8("wq_b", qlr, H * hd, ms, it);
    bench_lin8("wkv", dim, hd, ms, it);
    bench_lin8("wo_b", c.o_groups * c.o_lora_rank, dim, ms, it);
    bench_lin8("shared w1", dim, inter, ms, it);
    bench_lin8("shared w2", inter, dim, ms, it);
    bench_lin8("index wq_b", qlr, c.index_n_heads * c.index_head_dim, ms, it);
    bench_lin8("engram wkv", c.n_engram_columns() * c.engram_head_dim, dim * (c.hc_mult + 1), ms_decode, it);

    // the head runs at decode sizes only (prefill passes take the last position's logits)
    bench_dense("head", gpu::DenseType::BF16, dim, c.vocab_size, 1, false, ms_decode, quick ? 5 : 10, 4096);
    bench_dense("wo_a", gpu::DenseType::BF16, H * hd / c.o_groups, c.o_lora_rank, c.o_groups, true, ms, it, 256);
    bench_dense("compressor", gpu::DenseType::F32, dim, hd, 1, false, ms, it, hd);
    bench_dense("weights_proj", gpu::DenseType::BF16, dim, c.index_n_heads, 1, true, ms, it, c.index_n_heads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_linear: %s\n", e.what());
    return 2;
  }
  std::printf("comparisons failed: %d\n", g_failures);
  return g_failures ? 1 : 0;
}
