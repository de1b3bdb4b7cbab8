// GPU parity of the EXL3 linear kernels against the CPU decoder (src/exl3): bit-exact W_hat, and
// y = x·W on every path, K 1..8, every codebook, fp16/bf16/fp32 activations and outputs,
// zero-extended inputs, trimmed outputs, bias, split-K determinism, batched small-path calls, the
// epilogue's bf16 rounding; plus the shipped fixture.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "gpu_util.h"

namespace dsv41::test {
namespace {

using ops::ActType;
using ops::GemmPath;

struct GemmCase {
  int64_t k, n;
  int K, cb;
  int64_t m, x_cols, y_cols;
  ActType xt, yt;
  GemmPath path;
  int splits;
  bool bias;
};

std::string describe(const GemmCase& c) {
  return "k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) + " K=" + std::to_string(c.K) +
         " cb=" + std::to_string(c.cb) + " m=" + std::to_string(c.m) + " path=" +
         std::to_string(static_cast<int>(c.path)) + " splits=" + std::to_string(c.splits) +
         " xt=" + std::to_string(static_cast<int>(c.xt)) + " yt=" + std::to_string(static_cast<int>(c.yt));
}

double tolerance(ActType yt) { return yt == ActType::F32 ? 1e-3 : (yt == ActType::F16 ? 1.5e-3 : 5e-3); }

// fp32 rows of k values in, fp32 rows of y_stride out (y_cols written).
ops::GemmParams f32_params(const ops::Exl3Matrix& w, const DeviceBuffer& x, int64_t m, int64_t k,
                           const DeviceBuffer& y, int64_t y_cols, int64_t y_stride) {
  ops::GemmParams p;
  p.w = w;
  p.x = x.get();
  p.x_type = ActType::F32;
  p.m = m;
  p.x_cols = p.x_stride = k;
  p.y = y.get();
  p.y_type = ActType::F32;
  p.y_cols = y_cols;
  p.y_stride = y_stride;
  return p;
}

// Runs one case twice (bitwise determinism) and compares with the CPU fp32 reference.
void run_case(const GemmCase& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  RandomMatrix w(c.k, c.n, c.K, c.cb, seed, c.bias);
  std::mt19937_64 rng(seed * 7 + 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.m * c.x_cols));
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> xraw;
  x = round_acts(x, c.xt, xraw);

  // CPU reference on zero-extended rows.
  std::vector<float> xpad(static_cast<size_t>(c.m * c.k), 0.0f);
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t i = 0; i < c.x_cols; ++i) xpad[r * c.k + i] = x[r * c.x_cols + i];
  std::vector<float> yref(static_cast<size_t>(c.m * c.n));
  exl3::exl3_matmul_f32(w.view(), xpad.data(), c.m, yref.data());

  const int64_t y_stride = c.y_cols + 3;  // a gap after each row must stay untouched
  const size_t es = act_size(c.yt);
  DeviceBuffer d_x = DeviceBuffer::from(xraw);
  DeviceBuffer d_y(static_cast<size_t>(c.m * y_stride) * es);
  ops::GemmParams p;
  p.w = w.device();
  p.x = d_x.get();
  p.x_type = c.xt;
  p.m = c.m;
  p.x_cols = c.x_cols;
  p.x_stride = c.x_cols;
  p.y = d_y.get();
  p.y_type = c.yt;
  p.y_cols = c.y_cols;
  p.y_stride = y_stride;
  p.path = c.path;
  p.splits = c.splits;
  const ops::GemmPlan plan = ops::exl3_gemm_plan(p.w, c.m, c.path, c.splits);
  DeviceBuffer ws(plan.workspace);
  p.workspace = ws.get();
  p.workspace_bytes = ws.bytes();
  ops::exl3_workspace_init(ws.get(), ws.bytes(), nullptr);

  std::vector<std::vector<uint8_t>> outs;
  for (int rep = 0; rep < 2; ++rep) {
    CUDA_OK(cudaMemset(d_y.get(), 0xFF, d_y.bytes()));  // NaN poison
    ops::exl3_gemm(p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    outs.push_back(d_y.to_host<uint8_t>(d_y.bytes()));
  }
  EXPECT_EQ(outs[0], outs[1]) << "two identical launches differ";
  std::vector<float> got, want;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t i = 0; i < y_stride; ++i) {
      const uint8_t* e = &outs[0][(r * y_stride + i) * es];
      if (i < c.y_cols) {
        got.push_back(act_to_f32(e, c.yt));
        want.push_back(yref[r * c.n + i]);
      } else {
        for (size_t b = 0; b < es; ++b) ASSERT_EQ(e[b], 0xFF) << "wrote past y_cols at row " << r;
      }
    }
  }
  const double err = rel_rms(got, want);
  EXPECT_LE(err, tolerance(c.yt)) << "relative RMS error " << err;
}

TEST(Exl3GpuReconstruct, BitExactAllBitsAllCodebooks) {
  for (int K = 1; K <= 8; ++K) {
    for (int cb = 0; cb < 3; ++cb) {
      SCOPED_TRACE("K=" + std::to_string(K) + " cb=" + std::to_string(cb));
      RandomMatrix w(256, 384, K, cb, 1000 + K * 10 + cb);
      std::vector<uint16_t> ref(static_cast<size_t>(w.k * w.n));
      exl3::reconstruct_f16(w.trellis.data(), w.k, w.n, K, static_cast<exl3::Codebook>(cb), ref.data());
      DeviceBuffer d_out(ref.size() * 2);
      ops::exl3_reconstruct(w.device(), d_out.as<uint16_t>(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(d_out.to_host<uint16_t>(ref.size()), ref);
    }
  }
}

TEST(Exl3GpuGemm, SmallPathsAllBitsAllCodebooks) {
  uint64_t seed = 1;
  for (int K = 1; K <= 8; ++K) {
    for (int cb = 0; cb < 3; ++cb) {
      run_case({512, 384, K, cb, 1, 512, 384, ActType::F16, ActType::F32, GemmPath::F16, 0, false}, seed++);
      run_case({512, 256, K, cb, 8, 500, 250, ActType::BF16, ActType::F16, GemmPath::F16, 0, true}, seed++);
      if (cb == 2) {
        run_case({512, 384, K, cb, 1, 512, 384, ActType::F16, ActType::F32, GemmPath::Int8, 0, false}, seed++);
        run_case({384, 256, K, cb, 4, 300, 256, ActType::BF16, ActType::BF16, GemmPath::Int8, 0, true}, seed++);
      }
    }
  }
}

TEST(Exl3GpuGemm, LargePathAllBitsAllCodebooks) {
  uint64_t seed = 500;
  for (int K = 1; K <= 8; ++K) {
    for (int cb = 0; cb < 3; ++cb) {
      const int64_t m = (K % 2) ? 9 : 70;
      run_case({384, 256, K, cb, m, 384, 256, ActType::F16, ActType::F32, GemmPath::Large, 0, false}, seed++);
    }
  }
  run_case({1024, 512, 3, 2, 130, 1000, 500, ActType::BF16, ActType::BF16, GemmPath::Large, 0, true}, seed++);
  run_case({1024, 512, 4, 1, 200, 1024, 512, ActType::F32, ActType::F16, GemmPath::Large, 3, false}, seed++);
}

TEST(Exl3GpuGemm, SplitKCountsAgree) {
  // Many and few blocks per column group (stream-K grids of the small paths) or k-splits (large
  // path) must give the same answer within rounding, and each is deterministic.
  for (int splits : {1, 2, 5, 16})
    run_case({2048, 256, 3, 2, 3, 2048, 256, ActType::F16, ActType::F32, GemmPath::Int8, splits, false}, 900 + splits);
  for (int splits : {2, 7})
    run_case({2048, 384, 2, 0, 6, 2048, 384, ActType::BF16, ActType::F32, GemmPath::F16, splits, true}, 950 + splits);
  run_case({2048, 384, 4, 2, 2, 2048, 384, ActType::F16, ActType::F32, GemmPath::Auto, 0, false}, 990);
  // More column groups than resident blocks (as for the LM head): blocks then span a group tail,
  // whole groups and a group head.
  run_case({256, 128 * 700, 3, 2, 1, 256, 128 * 700 - 5, ActType::BF16, ActType::F32, GemmPath::Int8, 0, true}, 991);
  run_case({256, 128 * 700, 2, 1, 3, 256, 128 * 700, ActType::F16, ActType::F32, GemmPath::F16, 0, false}, 992);
}

// A batched small-path call: `batch` matrices of one shape and kind, matrix i reading its own rows of
// x (x + i·x_batch_stride, here interleaved in one row as the wo_a groups are) and writing its own
// columns of y; each matrix against the CPU reference, twice for bitwise repeatability, the gaps
// between the matrices' outputs untouched.
void run_batch_case(int64_t k, int64_t n, int K, int cb, int64_t m, int batch, GemmPath path, int splits,
                    ActType xt, uint64_t seed) {
  SCOPED_TRACE("batch " + std::to_string(batch) + " k=" + std::to_string(k) + " n=" + std::to_string(n) + " K=" +
               std::to_string(K) + " cb=" + std::to_string(cb) + " m=" + std::to_string(m) + " path=" +
               std::to_string(static_cast<int>(path)) + " splits=" + std::to_string(splits));
  std::vector<std::unique_ptr<RandomMatrix>> ws;
  std::vector<ops::Exl3Matrix> dev;
  for (int i = 0; i < batch; ++i) {
    ws.push_back(std::make_unique<RandomMatrix>(k, n, K, cb, seed + 31 * i, i % 2 == 1));
    dev.push_back(ws.back()->device());
  }
  const int64_t x_stride = batch * k, y_cols = n - 3, y_step = n + 5, y_stride = batch * y_step;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * x_stride));
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> xraw;
  x = round_acts(x, xt, xraw);
  DeviceBuffer d_x = DeviceBuffer::from(xraw), d_w = DeviceBuffer::from(dev);
  DeviceBuffer d_y(static_cast<size_t>(m * y_stride) * 4);
  ops::GemmParams p;
  p.w = dev.front();
  p.batch = batch;
  p.batch_w = d_w.as<ops::Exl3Matrix>();
  p.x = d_x.get();
  p.x_type = xt;
  p.m = m;
  p.x_cols = k;
  p.x_stride = x_stride;
  p.x_batch_stride = k;
  p.y = d_y.get();
  p.y_type = ActType::F32;
  p.y_cols = y_cols;
  p.y_stride = y_stride;
  p.y_batch_stride = y_step;
  p.path = path;
  p.splits = splits;
  const ops::GemmPlan plan = ops::exl3_gemm_plan(p.w, m, path, splits, batch);
  DeviceBuffer wsb(plan.workspace);
  ops::exl3_workspace_init(wsb.get(), wsb.bytes(), nullptr);
  p.workspace = wsb.get();
  p.workspace_bytes = wsb.bytes();
  std::vector<std::vector<float>> outs;
  for (int rep = 0; rep < 2; ++rep) {
    CUDA_OK(cudaMemset(d_y.get(), 0xFF, d_y.bytes()));
    ops::exl3_gemm(p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    outs.push_back(d_y.to_host<float>(static_cast<size_t>(m * y_stride)));
  }
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0) << "two identical launches differ";
  std::vector<float> xm(static_cast<size_t>(m * k)), yref(static_cast<size_t>(m * n));
  for (int i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(&x[static_cast<size_t>(r * x_stride + i * k)], k, &xm[static_cast<size_t>(r * k)]);
    exl3::exl3_matmul_f32(ws[static_cast<size_t>(i)]->view(), xm.data(), m, yref.data());
    std::vector<float> got, want;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < y_step; ++c) {
        const float v = outs[0][static_cast<size_t>(r * y_stride + i * y_step + c)];
        if (c < y_cols) {
          got.push_back(v);
          want.push_back(yref[static_cast<size_t>(r * n + c)]);
        } else {
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          ASSERT_EQ(bits, 0xFFFFFFFFu) << "matrix " << i << " wrote column " << c;
        }
      }
    const double err = rel_rms(got, want);
    EXPECT_LE(err, 1e-3) << "matrix " << i << ": relative RMS error " << err;
  }
}

TEST(Exl3GpuGemm, BatchedSmallPaths) {
  run_batch_case(512, 256, 3, 2, 1, 8, GemmPath::Int8, 0, ActType::F32, 1);   // the wo_a form: 8 groups, 1 row
  run_batch_case(512, 256, 3, 2, 4, 4, GemmPath::Int8, 3, ActType::BF16, 2);  // shared column groups
  run_batch_case(384, 384, 2, 0, 6, 3, GemmPath::F16, 0, ActType::F16, 3);
  run_batch_case(256, 128, 5, 1, 8, 5, GemmPath::F16, 2, ActType::F32, 4);
  run_batch_case(1024, 128, 4, 2, 2, 2, GemmPath::Auto, 0, ActType::F32, 5);
  // Refused on the host: a batch on the large path, overlapping outputs, no matrix array.
  RandomMatrix w(256, 256, 3, 2, 9);
  EXPECT_THROW(ops::exl3_gemm_plan(w.device(), 9, GemmPath::Auto, 0, 2), Error);
  EXPECT_THROW(ops::exl3_gemm_plan(w.device(), 1, GemmPath::Auto, 0, 0), Error);
  ops::GemmParams p;
  p.w = w.device();
  p.batch = 2;
  p.x = p.y = w.d_trellis.get();
  p.m = 1;
  p.x_cols = p.x_stride = 256;
  p.y_cols = p.y_stride = 256;
  p.y_batch_stride = 255;
  p.workspace = w.d_trellis.get();
  p.workspace_bytes = 1 << 30;
  EXPECT_THROW(ops::exl3_gemm(p, nullptr), Error);  // no batch_w, outputs overlapping
}

// round_bf16: every path stores the bf16 rounding (to nearest even) of exactly the fp32 value it
// stores without it, and leaves the columns past y_cols alone.
TEST(Exl3GpuGemm, EpilogueRoundsToBf16) {
  const int64_t k = 512, n = 384, y_cols = 380;
  for (const auto& [path, m] : {std::pair{GemmPath::Int8, int64_t{3}}, std::pair{GemmPath::F16, int64_t{7}},
                                std::pair{GemmPath::Large, int64_t{70}}}) {
    SCOPED_TRACE("path=" + std::to_string(static_cast<int>(path)));
    RandomMatrix w(k, n, 3, 2, 77 + m, true);
    std::mt19937_64 rng(m);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = nd(rng);
    DeviceBuffer d_x = DeviceBuffer::from(x), d_y(static_cast<size_t>(m * n) * 4);
    ops::GemmParams p = f32_params(w.device(), d_x, m, k, d_y, y_cols, n);
    p.path = path;
    const ops::GemmPlan plan = ops::exl3_gemm_plan(p.w, m, path);
    DeviceBuffer ws(plan.workspace);
    ops::exl3_workspace_init(ws.get(), ws.bytes(), nullptr);
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    std::vector<uint32_t> out[2];
    for (int round = 0; round < 2; ++round) {
      CUDA_OK(cudaMemset(d_y.get(), 0xFF, d_y.bytes()));
      p.round_bf16 = round == 1;
      ops::exl3_gemm(p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      out[round] = d_y.to_host<uint32_t>(static_cast<size_t>(m * n));
    }
    int64_t changed = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const size_t i = static_cast<size_t>(r * n + c);
        if (c >= y_cols) {
          ASSERT_EQ(out[1][i], 0xFFFFFFFFu) << "wrote past y_cols";
          continue;
        }
        float plain;
        std::memcpy(&plain, &out[0][i], 4);
        const uint32_t want = static_cast<uint32_t>(f32_to_bf16_bits(plain)) << 16;
        ASSERT_EQ(out[1][i], want) << "row " << r << " column " << c;
        changed += out[0][i] != want;
      }
    EXPECT_GT(changed, m * y_cols / 2) << "hardly any value changed: the rounding did not run";
  }
}

TEST(Exl3GpuGemm, FixtureMul1) {
  auto f = SafetensorsFile::open(std::string(DSV41_FIXTURES_DIR) + "/exl3/exl3_mul1_k256_n384.safetensors");
  for (int K = 2; K <= 4; ++K) {
    SCOPED_TRACE("K=" + std::to_string(K));
    const std::string pre = "k" + std::to_string(K) + ".";
    auto get = [&](const std::string& name) {
      const TensorInfo* t = f->find(pre + name);
      EXPECT_NE(t, nullptr) << name;
      return t;
    };
    const TensorInfo* tr = get("trellis");
    const TensorInfo* suh = get("suh");
    const TensorInfo* svh = get("svh");
    const TensorInfo* what = get("ref_w_hat_f16");
    const TensorInfo* xr = get("ref_x_f32");
    const TensorInfo* yr = get("ref_y_f32");
    ASSERT_TRUE(tr && suh && svh && what && xr && yr);
    const int64_t k = tr->shape[0] * 16, n = tr->shape[1] * 16, m = xr->shape[0];
    auto bytes = [](const TensorInfo* t) { return std::vector<uint8_t>(t->data, t->data + t->nbytes); };
    DeviceBuffer d_tr = DeviceBuffer::from(bytes(tr)), d_suh = DeviceBuffer::from(bytes(suh)),
                 d_svh = DeviceBuffer::from(bytes(svh)), d_x = DeviceBuffer::from(bytes(xr));
    ops::Exl3Matrix w;
    w.trellis = d_tr.as<uint16_t>();
    w.suh = d_suh.as<uint16_t>();
    w.svh = d_svh.as<uint16_t>();
    w.k = static_cast<int32_t>(k);
    w.n = static_cast<int32_t>(n);
    w.bits = K;
    w.codebook = 2;

    DeviceBuffer d_what(static_cast<size_t>(k * n) * 2);
    ops::exl3_reconstruct(w, d_what.as<uint16_t>(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(d_what.to_host<uint8_t>(d_what.bytes()), bytes(what)) << "W_hat not bit-exact";

    std::vector<float> yref(static_cast<size_t>(m * n));
    std::memcpy(yref.data(), yr->data, yref.size() * 4);
    for (GemmPath path : {GemmPath::Int8, GemmPath::F16, GemmPath::Large}) {
      SCOPED_TRACE("path=" + std::to_string(static_cast<int>(path)));
      DeviceBuffer d_y(static_cast<size_t>(m * n) * 4);
      ops::GemmParams p = f32_params(w, d_x, m, k, d_y, n, n);
      p.path = path;
      const ops::GemmPlan plan = ops::exl3_gemm_plan(w, m, path);
      DeviceBuffer ws(plan.workspace);
      ops::exl3_workspace_init(ws.get(), ws.bytes(), nullptr);
      p.workspace = ws.get();
      p.workspace_bytes = ws.bytes();
      ops::exl3_gemm(p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const double err = rel_rms(d_y.to_host<float>(yref.size()), yref);
      EXPECT_LE(err, 1e-3) << "relative RMS error " << err;
    }
  }
}

TEST(Exl3GpuGemm, RejectsBadArguments) {
  RandomMatrix w(256, 128, 3, 0, 77);
  ops::GemmParams p;
  p.w = w.device();
  DeviceBuffer d(1 << 20);
  p.x = p.y = d.get();
  p.m = 2;
  p.x_cols = p.x_stride = 256;
  p.y_cols = p.y_stride = 128;
  p.workspace = d.get();
  p.workspace_bytes = d.bytes();
  p.path = GemmPath::Int8;  // 3INST has no int8 path
  EXPECT_THROW(ops::exl3_gemm(p, nullptr), Error);
  p.path = GemmPath::Auto;
  p.x_cols = 300;  // wider than k
  EXPECT_THROW(ops::exl3_gemm(p, nullptr), Error);
  p.x_cols = 256;
  p.w.bits = 9;
  EXPECT_THROW(ops::exl3_gemm(p, nullptr), Error);
  p.w.bits = 3;
  p.w.n = 100;  // not a multiple of 128
  EXPECT_THROW(ops::exl3_gemm(p, nullptr), Error);
  p.w.n = 128;
  p.workspace_bytes = 16;
  EXPECT_THROW(ops::exl3_gemm(p, nullptr), Error);
}

// The large path keeps a ticket counter per (column group, 64-row block) in the workspace's fixed
// counter space: a matrix as wide as the head (129,280 columns) takes ~1,000 rows a call, and
// exl3_gemm_max_rows names the limit callers split at (one row block more is refused). Narrow
// matrices are not limited below a pass.
TEST(Exl3GpuGemm, RowLimitOfWideMatrices) {
  RandomMatrix head(128, 129280, 3, 2, 5);
  const int64_t most = ops::exl3_gemm_max_rows(head.device());
  EXPECT_GE(most, 1000);
  EXPECT_EQ(most % exl3::cuda::kLargeRows, 0);
  EXPECT_NO_THROW(ops::exl3_gemm_plan(head.device(), most));
  EXPECT_THROW(ops::exl3_gemm_plan(head.device(), most + 1), Error);
  EXPECT_GT(ops::exl3_gemm_workspace_bytes(head.device(), 4096), 0u);  // planned up to the limit only
  RandomMatrix expert(5120, 2304, 3, 2, 6);
  EXPECT_GE(ops::exl3_gemm_max_rows(expert.device()), 16384);
}

}  // namespace
}  // namespace dsv41::test
