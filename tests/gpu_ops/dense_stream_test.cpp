// The weight-streaming dense kernel (kernels/ops/dense_stream.cu): bit for bit with the CPU
// reference engine's dense Linear (dot.h order) at the real decode shapes (the compressor's fp32 and
// bf16 wkv, the index keys, weights_proj in bf16 and fp16, the grouped wo_a, a head-like many-row
// call) for m = 1..4
// and 7, whichever plan runs it (rows per tile, stages in flight, CTAs per SM: every plan must give
// the same bits), with partial last 256-blocks, strided activations, output stride gaps and groups;
// and the calls it declines. The real decode calls exactly as their call sites make them (packed
// rows): on the automatic plan (which must take them on an H200), on forced multi-stage plans of
// CTAs walking several tiles; the head never streamed automatically.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>

#include "harness.h"
#include "model/linears.h"
#include "ops/dense_stream.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;
namespace raw = ops::gpu::raw;

// Whether this device gives a block H200-class shared memory (227 KB), where the plans these tests
// name were measured. Under GB10's 99 KB (the suites' second run) fewer plans fit: fp32 rows of
// 5120 with four activation rows need 100 KB even at one weight row per tile, so such calls go to
// lin_dense's other kernels; there the tests still check every output against the CPU and that a
// plan never exceeds the limit, but not which kernel takes a call or how many forced plans fit.
bool roomy_smem() { return gpu::smem_per_block_limit() >= 200 * 1024; }
// `want` on H200-class devices, no pinned choice on the others.
std::optional<bool> where_roomy(std::optional<bool> want) { return roomy_smem() ? want : std::nullopt; }

// Forces the streaming kernel's mode and plan while in scope (0 = chosen per call).
struct StreamForce {
  int mode, rows, stages, cps;
  StreamForce(int m, int r, int s, int c)
      : mode(raw::set_dense_stream_mode(m)),
        rows(raw::set_dense_stream_rows_per_tile(r)),
        stages(raw::set_dense_stream_stages(s)),
        cps(raw::set_dense_stream_ctas_per_sm(c)) {}
  ~StreamForce() {
    raw::set_dense_stream_mode(mode);
    raw::set_dense_stream_rows_per_tile(rows);
    raw::set_dense_stream_stages(stages);
    raw::set_dense_stream_ctas_per_sm(cps);
  }
};

// One dense call with random weights and activations, its CPU reference computed once.
struct DenseProblem {
  std::string what;
  gpu::DenseType wt;
  int64_t in, out, groups, m, x_stride, y_stride;
  bool round;
  DeviceBuffer dw, dx;
  std::vector<float> want;  // [m][groups*out]

  // y_pad: output columns past each row's last that must stay untouched (0: packed rows, as the
  // compressor's calls write them).
  DenseProblem(gpu::DenseType t, int64_t in_, int64_t out_, int64_t groups_, int64_t m_, int64_t x_pad, bool round_,
               int64_t y_pad = 3)
      : wt(t), in(in_), out(out_), groups(groups_), m(m_), x_stride(groups_ * in_ + x_pad), y_stride(groups_ * out_ + y_pad),
        round(round_) {
    what = std::string(dense_type_name(wt)) + " " + std::to_string(groups) + "x" + std::to_string(out) + "x" +
           std::to_string(in) + " m=" + std::to_string(m) + (x_pad ? " strided" : "") + (round ? " rounded" : "");
    Rng rng(static_cast<uint64_t>(in * 13 + out * 5 + groups * 3 + m));
    const float sd = 1.0f / std::sqrt(static_cast<float>(in));
    // fp32 weights of full precision (the compressor's), bf16 / fp16 ones rounded
    DenseWeights dwv = dense_weights(rng, wt, static_cast<size_t>(groups * out * in), sd);
    const std::vector<float>& wv = dwv.values;
    // fp32 activations (the compressor's input is the fp32 normed hidden state)
    const std::vector<float> x = rng.f32_vec(static_cast<size_t>(m * x_stride));
    want.resize(static_cast<size_t>(m * groups * out));
    for (int64_t g = 0; g < groups; ++g) {
      auto lin = model::make_dense_linear(std::vector<float>(wv.begin() + g * out * in, wv.begin() + (g + 1) * out * in), in, out);
      std::vector<float> xg(static_cast<size_t>(m * in)), yg(static_cast<size_t>(m * out));
      for (int64_t r = 0; r < m; ++r) std::copy_n(&x[r * x_stride + g * in], in, &xg[r * in]);
      if (round) model::linear_bf16(*lin, xg.data(), m, yg.data());
      else lin->forward(xg.data(), m, yg.data());
      for (int64_t r = 0; r < m; ++r) std::copy_n(&yg[r * out], out, &want[r * groups * out + g * out]);
    }
    dw = std::move(dwv.device);
    dx = DeviceBuffer::from(x);
  }

  gpu::DenseArgs args(float* y) const {
    gpu::DenseArgs a;
    a.w = dw.get();
    a.wt = wt;
    a.in = in;
    a.out = out;
    a.groups = groups;
    a.x = dx.as<float>();
    a.x_stride = x_stride;
    a.m = m;
    a.y = y;
    a.y_stride = y_stride;
    a.round_bf16 = round;
    return a;
  }

  // One lin_dense call (under whatever force is in scope), compared bit for bit with the CPU; the
  // stride gaps and the guard zones must stay untouched. `expect_stream` (when given): whether the
  // call must take the streaming kernel.
  void check(const std::string& tag, std::optional<bool> expect_stream) const {
    const std::string w = what + " " + tag;
    SCOPED_TRACE(w);
    Guarded dy(static_cast<size_t>(m * y_stride) * 4);
    const gpu::DenseArgs a = args(dy.as<float>());
    if (expect_stream) EXPECT_EQ(raw::dense_stream_takes(a), *expect_stream) << w;
    gpu::lin_dense(a, nullptr);
    sync_ok();
    expect_equal(w, strided_rows(w, dy, m, y_stride, groups * out), want);
    expect_guards(w, dy);
  }
};

// The decode shapes of the real model (and the tiny fixture's) on the automatic choice (the index
// keys and weights_proj must take the streaming kernel, the real wo_a keeps the tiled kernel: it
// does not fit one wave; the compressor's choice depends on the device's SM count, so it is checked
// for its outputs only);
// m = 7 with the kernel forced on (lin_dense leaves m > 4 to its other kernels), on a plan of 2 rows
// per tile and 3 stages, so that CTAs walk several tiles and both activation row tiles.
TEST(DenseStream, DecodeShapesMatchCpu) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const bool real = s.name == "real";
    const int64_t in_g = c.num_attention_heads * c.head_dim / c.o_groups;
    for (int64_t m : {1, 2, 3, 4, 7}) {
      const std::vector<std::optional<bool>> expect = {std::nullopt, std::nullopt, true, true, true,
                                                       real ? std::optional<bool>(false) : std::nullopt};
      const std::vector<std::shared_ptr<DenseProblem>> ps = {
          // compressor wkv / wgate (ratio > 1: fp32 weights, fp32 outputs)
          std::make_shared<DenseProblem>(gpu::DenseType::F32, c.hidden_size, c.head_dim, 1, m, 0, false),
          // compressor wkv (ratio 1: bf16 weights, rounded)
          std::make_shared<DenseProblem>(gpu::DenseType::BF16, c.hidden_size, c.head_dim, 1, m, 0, true),
          // index keys
          std::make_shared<DenseProblem>(gpu::DenseType::BF16, c.head_dim, c.index_head_dim, 1, m, 0, true),
          // indexer weights_proj
          std::make_shared<DenseProblem>(gpu::DenseType::BF16, c.hidden_size, c.index_n_heads, 1, m, 0, true),
          // the same in an EXL3 checkpoint (fp16, unquantized there)
          std::make_shared<DenseProblem>(gpu::DenseType::F16, c.hidden_size, c.index_n_heads, 1, m, 0, true),
          // grouped wo_a
          std::make_shared<DenseProblem>(gpu::DenseType::BF16, in_g, c.o_lora_rank, c.o_groups, m, 0, true),
      };
      for (size_t i = 0; i < ps.size(); ++i) {
        if (m <= raw::kDenseStreamMaxRows) {
          ps[i]->check(s.name + " automatic", where_roomy(expect[i]));
        } else {
          ps[i]->check(s.name + " automatic", false);
          StreamForce on(2, 2, 3, 0);
          ps[i]->check(s.name + " forced on", where_roomy(true));
        }
      }
    }
  }
}

// A call of many output rows (the head's form): on the automatic choice (which kernel takes it
// depends on the device's SM count, so only the outputs are checked); forced to 4 rows per tile and
// 2 stages, CTAs walk several tiles with a tile in flight.
TEST(DenseStream, ManyRowsStreamMatchesCpu) {
  for (int64_t m : {1, 2, 4}) {
    DenseProblem p(gpu::DenseType::BF16, 5120, 4100, 1, m, 0, false);
    p.check("automatic", std::nullopt);
    StreamForce force(2, 4, 2, 0);
    raw::DenseStreamPlan plan;
    Guarded dy(4);
    const bool planned = raw::dense_stream_plan(p.args(dy.as<float>()), &plan);
    if (roomy_smem()) ASSERT_TRUE(planned);
    if (planned) {
      EXPECT_LE(plan.smem, gpu::smem_per_block_limit());
      EXPECT_GT(plan.tiles, plan.ctas) << "CTAs should walk several tiles";
      EXPECT_EQ(plan.stages, 2);
    }
    p.check("4 rows per tile, 2 stages", planned);
  }
}

// Every plan gives the same bits (the CPU's): rows per tile 1..32, 1..4 stages, CTAs per SM capped
// (so that CTAs walk several tiles, across group and activation-row-tile boundaries), on shapes
// with a partial last 256-block, odd output counts, groups, strided activations.
TEST(DenseStream, EveryPlanMatchesCpu) {
  struct Force {
    int rows, stages, cps;
  };
  const Force forces[] = {{1, 1, 0}, {2, 2, 0}, {4, 3, 1}, {8, 4, 1}, {16, 2, 0}, {32, 1, 0}, {4, 2, 2}, {1, 4, 1}};
  for (int64_t m : {1, 3, 4, 7}) {
    const std::vector<std::shared_ptr<DenseProblem>> ps = {
        std::make_shared<DenseProblem>(gpu::DenseType::BF16, 1032, 300, 2, m, 4, true),
        std::make_shared<DenseProblem>(gpu::DenseType::F32, 520, 97, 3, m, 8, false),
        std::make_shared<DenseProblem>(gpu::DenseType::BF16, 264, 16, 1, m, 0, false),
        std::make_shared<DenseProblem>(gpu::DenseType::F32, 5120, 40, 1, m, 0, true),
    };
    for (const auto& p : ps) {
      int streamed = 0;
      for (const Force& f : forces) {
        StreamForce force(2, f.rows, f.stages, f.cps);
        const std::string tag = "r" + std::to_string(f.rows) + "s" + std::to_string(f.stages) + "c" + std::to_string(f.cps);
        Guarded dy(4);
        raw::DenseStreamPlan plan;
        // a forced plan whose shared memory does not fit leaves the call to the other kernels
        const bool fits = raw::dense_stream_plan(p->args(dy.as<float>()), &plan);
        if (fits) {
          EXPECT_LE(plan.smem, gpu::smem_per_block_limit()) << p->what;
          EXPECT_EQ(plan.rows_per_tile, f.rows) << p->what;
          EXPECT_EQ(plan.stages, f.stages) << p->what;
          ++streamed;
        }
        p->check(tag, fits);
      }
      if (roomy_smem()) EXPECT_GE(streamed, 3) << p->what;
    }
  }
}

// Calls the kernel cannot take (rows not a multiple of 16 bytes, misaligned activations) go to the
// other kernels; the mode switch turns it off and on.
TEST(DenseStream, Declines) {
  DenseProblem odd(gpu::DenseType::BF16, 300, 37, 1, 1, 0, true);  // 600-byte rows
  odd.check("unaligned rows", false);
  DenseProblem p(gpu::DenseType::F32, 512, 64, 1, 2, 4, false);
  Guarded dy(static_cast<size_t>(p.m * p.y_stride) * 4);
  gpu::DenseArgs a = p.args(dy.as<float>());
  a.x += 1;  // 4-byte aligned activations only
  EXPECT_FALSE(raw::dense_stream_plan(a, nullptr));
  a.x -= 1;
  a.x_stride += 1;
  EXPECT_FALSE(raw::dense_stream_plan(a, nullptr));
  {
    StreamForce off(1, 0, 0, 0);
    p.check("off", false);
  }
  p.check("automatic", true);  // 512 fp32 rows, two activation rows: fits GB10 as well
}

// The decode calls of the real model exactly as their call sites make them (src/ops/gpu_compressor.cpp,
// src/cuda_model/cuda_load.cpp and cuda_attention.cpp): the compressor's wkv and wgate (dim ->
// head_dim; fp32 weights and fp32 outputs at ratio > 1, both the same shape; bf16 weights rounded
// at ratio 1), its index keys (head_dim -> index_head_dim, bf16 or, from an fp32 checkpoint, fp32
// weights, rounded) and weights_proj (dim -> index_n_heads, bf16, rounded), packed activation and
// output rows. On the automatic plan for m = 1..4: on a device of the H200's size (>= 132 SMs, the
// one the plan was measured on) each call must take the streaming kernel with one tile per CTA in
// one wave, one stage; bit for bit with the CPU on any device.
struct RealCall {
  std::string name;
  gpu::DenseType wt;
  int64_t in, out;
  bool round;
};
std::vector<RealCall> real_decode_calls(const ModelConfig& c) {
  return {{"compressor wkv/wgate (ratio > 1)", gpu::DenseType::F32, c.hidden_size, c.head_dim, false},
          {"compressor wkv (ratio 1)", gpu::DenseType::BF16, c.hidden_size, c.head_dim, true},
          {"index keys", gpu::DenseType::BF16, c.head_dim, c.index_head_dim, true},
          {"index keys (fp32)", gpu::DenseType::F32, c.head_dim, c.index_head_dim, true},
          {"weights_proj", gpu::DenseType::BF16, c.hidden_size, c.index_n_heads, true}};
}

// Runs f(call, problem) on each real decode call at m = 1..4, packed rows as its call site makes them.
template <class F>
void for_each_real_decode_problem(F&& f) {
  for (const RealCall& rc : real_decode_calls(shape_sets()[0].cfg)) {
    for (int64_t m = 1; m <= 4; ++m) {
      DenseProblem p(rc.wt, rc.in, rc.out, 1, m, 0, rc.round, 0);
      f(rc, p);
    }
  }
}

TEST(DenseStream, RealDecodeCallsAutomaticPlanMatchesCpu) {
  StreamForce automatic(0, 0, 0, 0);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for_each_real_decode_problem([&](const RealCall& rc, DenseProblem& p) {
    const int64_t m = p.m;
    const std::string what = rc.name + " " + p.what;
    SCOPED_TRACE(what);
    Guarded probe(4);
    raw::DenseStreamPlan plan;
    const bool planned = raw::dense_stream_plan(p.args(probe.as<float>()), &plan);
    if (planned) {
      std::printf("  [plan]   %-60s rows/tile %d stages %d act rows %d threads %d tiles %lld ctas %lld smem %zu\n",
                  what.c_str(), plan.rows_per_tile, plan.stages, plan.act_rows, plan.threads,
                  static_cast<long long>(plan.tiles), static_cast<long long>(plan.ctas), plan.smem);
      EXPECT_EQ(plan.ctas, plan.tiles) << "the automatic plan keeps to one tile per CTA";
      EXPECT_EQ(plan.stages, 1);
      EXPECT_EQ(plan.act_rows, m == 3 ? 4 : m);
    } else {
      std::printf("  [plan]   %-60s none on %d SMs\n", what.c_str(), sms);
    }
    if (sms >= 132 && roomy_smem()) EXPECT_TRUE(planned) << "no one-wave plan on a device of " << sms << " SMs";
    p.check("automatic", planned);
  });
}

// The head (dim -> vocab, fp32 outputs, bf16 or fp32 weights; whole or one of two tensor-parallel
// halves) never fits one wave: the automatic plan leaves it to lin_dense's other kernels at every
// decode size (a head-like call forced onto the streaming kernel: ManyRowsStreamMatchesCpu). The
// arguments are only planned (no weights read).
TEST(DenseStream, HeadNotStreamedAutomatically) {
  StreamForce automatic(0, 0, 0, 0);
  const ModelConfig& c = shape_sets()[0].cfg;
  DeviceBuffer w(256), x(static_cast<size_t>(4 * c.hidden_size) * 4), y(256);
  for (gpu::DenseType t : {gpu::DenseType::BF16, gpu::DenseType::F32})
    for (int64_t vocab : {c.vocab_size, c.vocab_size / 2})
      for (int64_t m = 1; m <= 4; ++m) {
        gpu::DenseArgs a;
        a.w = w.get();
        a.wt = t;
        a.in = c.hidden_size;
        a.out = vocab;
        a.x = x.as<float>();
        a.x_stride = c.hidden_size;
        a.m = m;
        a.y = y.as<float>();
        a.y_stride = c.vocab_size;
        a.round_bf16 = false;
        EXPECT_FALSE(raw::dense_stream_takes(a)) << "head " << vocab << " rows m=" << m;
      }
}

// The real decode calls on forced plans that the automatic one never picks: several tiles per CTA
// (CTAs per SM capped at 1) with 2..4 tiles in flight, and one plan of many rows per tile; every
// plan that fits the shared memory must give the CPU's bits. Per call at least two plans of several
// stages must fit, and where the call has more weight rows than twice the SMs (the compressor's 512
// on an H200) at least two of them must also have CTAs walk several tiles (calls of fewer rows than
// SMs cannot: a CTA gets at least one tile; EveryPlanMatchesCpu walks tiles on such shapes).
TEST(DenseStream, RealDecodeCallsMultiStagePlansMatchCpu) {
  struct Force {
    int rows, stages, cps;
  };
  const Force forces[] = {{1, 4, 1}, {2, 3, 1}, {2, 2, 1}, {4, 2, 1}, {1, 2, 1}, {16, 2, 0}};
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for_each_real_decode_problem([&](const RealCall& rc, DenseProblem& p) {
    int staged = 0, walking = 0;
    for (const Force& f : forces) {
      StreamForce force(2, f.rows, f.stages, f.cps);
      const std::string tag = rc.name + " r" + std::to_string(f.rows) + "s" + std::to_string(f.stages) + "c" + std::to_string(f.cps);
      Guarded probe(4);
      raw::DenseStreamPlan plan;
      const bool fits = raw::dense_stream_plan(p.args(probe.as<float>()), &plan);
      if (fits) {
        EXPECT_LE(plan.smem, gpu::smem_per_block_limit()) << p.what << " " << tag;
        EXPECT_EQ(plan.rows_per_tile, f.rows) << p.what << " " << tag;
        EXPECT_EQ(plan.stages, f.stages) << p.what << " " << tag;
        staged += plan.stages > 1;
        walking += plan.stages > 1 && plan.tiles > plan.ctas;
      }
      p.check(tag, fits);
    }
    if (roomy_smem()) {
      EXPECT_GE(staged, 2) << rc.name << " " << p.what;
      if (rc.out > 2 * sms) EXPECT_GE(walking, 2) << rc.name << " " << p.what;
    }
  });
}

}  // namespace
}  // namespace dsv41::test
