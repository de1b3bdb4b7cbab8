// GPU parity of the EXL3 linear kernels against the CPU decoder (src/exl3): bit-exact W_hat, and
// y = x·W on every path, K 1..8, every codebook, fp16/bf16/fp32 activations and outputs,
// zero-extended inputs, trimmed outputs, bias, split-K determinism; plus the shipped fixture.
#include <gtest/gtest.h>

#include <string>

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
      ops::GemmParams p;
      p.w = w;
      p.x = d_x.get();
      p.x_type = ActType::F32;
      p.m = m;
      p.x_cols = p.x_stride = k;
      p.y = d_y.get();
      p.y_type = ActType::F32;
      p.y_cols = p.y_stride = n;
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
