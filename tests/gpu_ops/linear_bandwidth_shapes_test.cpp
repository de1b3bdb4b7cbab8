// Bit-for-bit parity of the decode-bandwidth linear paths against the CPU reference engine's own
// Linear objects: Lin8 at every row-group size (1, 2, 4 rows per weight read, several groups), K block
// counts that do and do not divide the lane chunk (32, 16, 8, a ragged 3), output counts off the
// tile, output strides with gaps; Lin4 expert banks whose pairs share experts (grouped reads of 1,
// 2 and 4 rows, leftovers), empty slots and a bank of one without ids; the older tiled dense kernel
// at every (rows, K split) it picks, partial 256-blocks, grouped weights and strided activations,
// and the decode-size dense calls on the streaming kernel and the older ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "harness.h"
#include "linear_inputs.h"
#include "model/linears.h"
#include "ops/dense_ring.h"
#include "ops/dense_stream.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

void lin8_case(int64_t in, int64_t out, int64_t m, bool round) {
  const std::string what = "lin8 " + std::to_string(out) + "x" + std::to_string(in) + " m=" + std::to_string(m) +
                           (round ? "" : " fp32");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 13 + out * 3 + m));
  const std::vector<uint8_t> codes = rng.e4m3_bytes(static_cast<size_t>(in * out));
  const std::vector<uint8_t> scales = rng.e8m0_bytes(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)));
  SafetensorsWriter w;
  w.add("w.weight", DType::F8_E4M3, {out, in}, codes);
  w.add("w.scale", DType::F8_E8M0, {(out + 31) / 32, (in + 31) / 32}, scales);
  TempCheckpoint ck(w);
  auto lin = model::load_linear(*ck.ck, "w", in, out);
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * in));
  std::vector<float> want(static_cast<size_t>(m * out));
  if (round) model::linear_bf16(*lin, x.data(), m, want.data());
  else lin->forward(x.data(), m, want.data());

  DeviceBuffer dcodes = DeviceBuffer::from(codes), dscales = DeviceBuffer::from(scales);
  QuantAct qa(x, m, in);
  const int64_t y_stride = out + 3;
  Guarded dy(static_cast<size_t>(m * y_stride) * 4);
  gpu::Lin8Args a;
  a.w = {dcodes.as<uint8_t>(), dscales.as<uint8_t>(), in, out};
  a.x_codes = qa.codes.as<uint8_t>();
  a.x_scales = qa.scales.as<float>();
  a.m = m;
  a.y = dy.as<float>();
  a.y_stride = y_stride;
  a.round_bf16 = round;
  a.exact_block_sums = true;  // the sequential kernel, bit for bit with the CPU
  gpu::lin8(a, nullptr);
  sync_ok();
  expect_equal(what, strided_rows(what, dy, m, y_stride, out), want);
  expect_guards(what, dy);
}

TEST(GpuLinearBandwidth, Lin8RowGroupsAndChunks) {
  // K blocks: 160 (chunk 32), 16 (chunk 16), 40 (chunk 8), 3 (ragged chunk of 8)
  for (int64_t m : {1, 2, 3, 4, 5, 9}) {
    lin8_case(5120, 96, m, true);
    lin8_case(512, 300, m, true);
    lin8_case(1280, 544, m, true);
    lin8_case(96, 37, m, true);
  }
  // many output rows: the widest lane tiles (8 outputs per lane at 1 row, 4 at 2 and 4 rows)
  for (int64_t m : {1, 2, 4}) lin8_case(1024, 8500, m, true);
  lin8_case(512, 300, 3, false);   // fp32 outputs
  // more CTA tiles than the grid has CTAs: warps loop over several tiles (and their L2 windows)
  lin8_case(64, 110000, 1, true);
  // many row groups: the pass-sized grid
  lin8_case(512, 300, 40, true);
}

void lin4_case(const std::string& tag, int64_t in, int64_t out, int64_t n_experts, const std::vector<int32_t>& ids_in,
               int64_t x_row_div, bool with_ids) {
  const int64_t rows = static_cast<int64_t>(ids_in.size()), x_rows = (rows + x_row_div - 1) / x_row_div;
  const std::string what = "lin4 " + tag + " " + std::to_string(out) + "x" + std::to_string(in) + " rows=" +
                           std::to_string(rows);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 5 + out + rows * 7));
  std::vector<uint8_t> packed(static_cast<size_t>(n_experts * out * in / 2));
  for (auto& b : packed) b = static_cast<uint8_t>(rng.g());
  const std::vector<uint8_t> scales = rng.e8m0_bytes(static_cast<size_t>(n_experts * out * (in / 32)));
  SafetensorsWriter w;
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string p = "e" + std::to_string(e);
    w.add(p + ".weight", DType::I8, {out, in / 2}, packed.data() + e * out * in / 2, static_cast<size_t>(out * in / 2));
    w.add(p + ".scale", DType::F8_E8M0, {out, in / 32}, scales.data() + e * out * (in / 32),
          static_cast<size_t>(out * (in / 32)));
  }
  TempCheckpoint ck(w);
  std::vector<std::unique_ptr<Linear>> lins;
  for (int64_t e = 0; e < n_experts; ++e) lins.push_back(model::load_linear(*ck.ck, "e" + std::to_string(e), in, out));
  const std::vector<float> x = rng.bf16_vec(static_cast<size_t>(x_rows * in));
  std::vector<float> want(static_cast<size_t>(rows * out), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t e = with_ids ? ids_in[r] : 0;
    if (e >= 0 && e < n_experts) model::linear_bf16(*lins[e], &x[(r / x_row_div) * in], 1, &want[r * out]);
  }
  DeviceBuffer dpacked = DeviceBuffer::from(packed), dscales = DeviceBuffer::from(scales), dids = DeviceBuffer::from(ids_in);
  QuantAct qa(x, x_rows, in);
  const int64_t y_stride = out + 1;
  Guarded dy(static_cast<size_t>(rows * y_stride) * 4);
  gpu::Lin4Args a;
  a.w = {dpacked.as<uint8_t>(), dscales.as<uint8_t>(), in, out, n_experts};
  a.x_codes = qa.codes.as<uint8_t>();
  a.x_scales = qa.scales.as<float>();
  a.rows = rows;
  a.expert_ids = with_ids ? dids.as<int32_t>() : nullptr;
  a.x_row_div = x_row_div;
  a.y = dy.as<float>();
  a.y_stride = y_stride;
  gpu::lin4(a, nullptr);
  sync_ok();
  expect_equal(what, strided_rows(what, dy, rows, y_stride, out), want);
  expect_guards(what, dy);
}

TEST(GpuLinearBandwidth, Lin4SharedExperts) {
  // one token, distinct experts (one row per read), gate/up form
  lin4_case("decode", 512, 96, 8, {3, 0, 7, 5, 1, 6}, 6, true);
  // a tall bank: more CTA tiles per pair than the pair's CTAs (warps loop); an empty slot zeroes a
  // long row
  lin4_case("decode tall", 64, 17000, 8, {3, 0, -1, 5, 1, 6}, 6, true);
  // two tokens picking overlapping experts, an empty slot, an id past the bank (both zero rows)
  lin4_case("batch2", 512, 96, 8, {3, 0, 7, 5, 1, 6, 0, 3, -1, 5, 2, 8}, 6, true);
  // decode batches over a larger bank (rows of one per read): the Lin4 decode grid deals the tiles
  // of all pairs over one wave of warps (at 24 pairs on 132 SMs some warps take two tiles), several
  // K chunks (in = 1280: 5 chunks of 8 blocks), a ragged last tile; an empty slot
  {
    std::vector<int32_t> ids;
    for (int t = 0; t < 4; ++t)
      for (int k = 0; k < 6; ++k) ids.push_back(static_cast<int32_t>((t * 7 + k * 4) % 25));
    ids[9] = -1;
    lin4_case("decode batch4", 1280, 2900, 25, ids, 6, true);
    ids.resize(12);
    lin4_case("decode batch2 down", 1280, 1500, 25, ids, 1, true);
  }
  // rows in (8, 64]: groups of two, an expert used three times (a leftover single)
  {
    std::vector<int32_t> ids;
    for (int i = 0; i < 30; ++i) ids.push_back(static_cast<int32_t>((i * 7) % 5));
    ids[11] = -1;
    lin4_case("pairs", 256, 200, 5, ids, 1, true);
    lin4_case("pairs gate/up", 256, 200, 5, ids, 3, true);
  }
  // rows > 64: groups of four, popular experts with many groups, K chunk 8 with idle lanes (in=128)
  {
    Rng rng(99);
    std::vector<int32_t> ids;
    for (int i = 0; i < 150; ++i) ids.push_back(static_cast<int32_t>(rng.below(10) < 6 ? 1 : rng.below(6)));
    ids[40] = -1;
    lin4_case("pass", 128, 72, 6, ids, 1, true);
    lin4_case("pass gate/up", 1280, 40, 6, ids, 5, true);
  }
  // a plain Lin4 (bank of one, no ids): consecutive rows share the weight
  lin4_case("plain", 512, 130, 1, std::vector<int32_t>(7, 0), 1, false);
  lin4_case("plain", 512, 130, 1, std::vector<int32_t>(70, 0), 1, false);
}

void dense_case(gpu::DenseType wt, int64_t in, int64_t out, int64_t groups, int64_t m, int64_t x_pad, bool round) {
  const std::string what = std::string(dense_type_name(wt)) + " " + std::to_string(groups) + "x" +
                           std::to_string(out) + "x" + std::to_string(in) + " m=" + std::to_string(m) +
                           (x_pad ? " strided" : "");
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(in * 11 + out * 3 + groups + m));
  const float sd = 1.0f / std::sqrt(static_cast<float>(in));
  DenseWeights dwv = dense_weights(rng, wt, static_cast<size_t>(groups * out * in), sd);
  const std::vector<float>& wv = dwv.values;
  const int64_t x_stride = groups * in + x_pad;
  std::vector<float> x = rng.bf16_vec(static_cast<size_t>(m * x_stride));
  std::vector<float> want(static_cast<size_t>(m * groups * out));
  for (int64_t g = 0; g < groups; ++g) {
    auto lin = model::make_dense_linear(std::vector<float>(wv.begin() + g * out * in, wv.begin() + (g + 1) * out * in), in, out);
    std::vector<float> xg(static_cast<size_t>(m * in)), yg(static_cast<size_t>(m * out));
    for (int64_t r = 0; r < m; ++r) std::copy_n(&x[r * x_stride + g * in], in, &xg[r * in]);
    if (round) model::linear_bf16(*lin, xg.data(), m, yg.data());
    else lin->forward(xg.data(), m, yg.data());
    for (int64_t r = 0; r < m; ++r) std::copy_n(&yg[r * out], out, &want[r * groups * out + g * out]);
  }
  DeviceBuffer dw = std::move(dwv.device);
  DeviceBuffer dx = DeviceBuffer::from(x);
  const int64_t y_stride = groups * out + 2;
  Guarded dy(static_cast<size_t>(m * y_stride) * 4);
  gpu::DenseArgs a;
  a.w = dw.get();
  a.wt = wt;
  a.in = in;
  a.out = out;
  a.groups = groups;
  a.x = dx.as<float>();
  a.x_stride = x_stride;
  a.m = m;
  a.y = dy.as<float>();
  a.y_stride = y_stride;
  a.round_bf16 = round;
  gpu::lin_dense(a, nullptr);
  sync_ok();
  expect_equal(what, strided_rows(what, dy, m, y_stride, groups * out), want);
  expect_guards(what, dy);
}

// Sets the weight-streaming dense kernel's mode while in scope (kernels/ops/dense_stream.h: 0 =
// automatic, 1 = off).
struct DenseStreamMode {
  int prev;
  explicit DenseStreamMode(int mode) : prev(gpu::raw::set_dense_stream_mode(mode)) {}
  ~DenseStreamMode() { gpu::raw::set_dense_stream_mode(prev); }
};
// The same for the ring kernel (kernels/ops/dense_ring.h: 0 = automatic, 1 = off, 2 = every call
// it can take).
struct DenseRingMode {
  int prev;
  explicit DenseRingMode(int mode) : prev(gpu::raw::set_dense_ring_mode(mode)) {}
  ~DenseRingMode() { gpu::raw::set_dense_ring_mode(prev); }
};

TEST(GpuLinearBandwidth, DenseTiledSplits) {
  using gpu::DenseType;
  // The older kernels with the streaming kernel off (they still take what its plan cannot fit): the
  // warp-per-row kernel takes up to 1024 output rows at m <= 4 and up to 64 at larger m, the tiled
  // kernel the rest.
  DenseStreamMode off(1);
  DenseRingMode ring_off(1);
  for (int64_t m : {1, 2, 3, 4}) dense_case(DenseType::BF16, 5120, 1100, 1, m, 0, true);  // K split 8 / 8 / 4 / 4
  for (int64_t m : {1, 2, 3, 4, 5, 9, 17}) {
    dense_case(DenseType::BF16, 5120, 40, 1, m, 0, true);     // few rows
    dense_case(DenseType::BF16, 1032, 300, 1, m, 4, true);    // partial last 256-block, strided x
    dense_case(DenseType::F32, 520, 96, 2, m, 0, false);      // fp32 weights, groups, 32-column pieces
    dense_case(DenseType::F16, 1032, 300, 1, m, 4, true);     // fp16 weights (EXL3's unquantized linears)
  }
  dense_case(DenseType::F16, 5120, 1100, 1, 2, 0, true);      // fp16, K split
  dense_case(DenseType::F16, 5120, 40, 1, 5, 0, true);        // fp16, few rows (warp kernel, vector loads)
  dense_case(DenseType::F16, 263, 40, 1, 3, 1, false);        // fp16, unaligned rows (warp kernel, scalar)
  dense_case(DenseType::BF16, 2048, 4100, 1, 1, 0, false);    // many CTAs: no split, off-tile rows
  dense_case(DenseType::BF16, 512, 1024, 4, 2, 0, true);      // grouped (wo_a form)
  dense_case(DenseType::BF16, 264, 16, 1, 3, 0, true);        // one full block and an 8-wide one
}

// The few-rows linears at the decode shapes of the real model (compressor wkv/wgate in fp32, index
// keys and weights_proj in bf16), a last tile with fewer rows, rows whose last 256-block is
// partial, strided activations and groups: on the weight-streaming kernel (automatic) and on the
// older kernels (streaming off).
TEST(GpuLinearBandwidth, DenseFewRowsDecodeShapes) {
  using gpu::DenseType;
  for (int mode : {0, 1}) {
    SCOPED_TRACE(mode ? "older kernels" : "streaming kernel");
    DenseStreamMode force(mode);
    for (int64_t m : {1, 2, 3, 4}) {
      dense_case(DenseType::F32, 5120, 512, 1, m, 0, false);   // compressor wkv / wgate
      dense_case(DenseType::BF16, 512, 128, 1, m, 0, true);    // index keys
      dense_case(DenseType::BF16, 5120, 32, 1, m, 0, true);    // weights_proj
      dense_case(DenseType::BF16, 2056, 1001, 1, m, 8, false); // partial last tile and block
      dense_case(DenseType::F16, 6144, 640, 1, m, 0, true);    // Engram wkv's K in fp16 (EXL3)
    }
    dense_case(DenseType::F32, 5120, 1024, 1, 1, 0, true);     // rounded outputs
    dense_case(DenseType::BF16, 1024, 96, 8, 2, 0, true);      // groups
  }
}

// The ring kernel (one cp.async ring a warp, kernels/ops/dense_ring.cu) on every call it can take,
// at each K split (1, 2, 4 warps a tile): one to four rows (one, two and four chains a lane, three
// in the four-chain form), bf16 and fp16, a last warp with a few rows and CTAs with idle warps, K in
// whole stages, with a partial last stage (1032 = 16 stages + 8 columns, also a partial 256-block
// and five blocks over four warps), within one stage (one block: split warps without blocks),
// groups, strided activations and fp32 outputs; then the calls it takes automatically, at the
// real head and wo_a shapes' splits.
TEST(GpuLinearBandwidth, DenseRing) {
  using gpu::DenseType;
  struct Split {
    int prev;
    explicit Split(int p) : prev(gpu::raw::set_dense_ring_split(p)) {}
    ~Split() { gpu::raw::set_dense_ring_split(prev); }
  };
  {
    DenseStreamMode off(1);
    DenseRingMode forced(2);
    for (int p : {1, 2, 4}) {
      SCOPED_TRACE("split " + std::to_string(p));
      Split split(p);
      for (int64_t m : {1, 2, 3, 4}) {
        dense_case(DenseType::BF16, 5120, 300, 1, m, 0, false);   // idle warps in the last CTA
        dense_case(DenseType::BF16, 1032, 1100, 1, m, 4, true);   // partial stage and block, strided x
        dense_case(DenseType::F16, 1032, 37, 1, m, 0, true);      // a full warp, one of 5 rows
        dense_case(DenseType::BF16, 40, 96, 3, m, 8, false);      // K within one stage, groups
      }
      dense_case(DenseType::F16, 6144, 640, 1, 2, 0, true);
    }
  }
  // Automatically: enough rows that tiles split K at most four ways give a CTA of warps an SM.
  DenseRingMode automatic(0);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int64_t head_rows = 2 * 128 * static_cast<int64_t>(sms) + 33;
  DeviceBuffer w(256), x(5 * 4096 * 4 * 8), y(256);
  gpu::DenseArgs a;
  a.w = w.get();
  a.in = 512;
  a.out = head_rows;
  a.x = x.as<float>();
  a.x_stride = 512;
  a.y = y.as<float>();
  a.y_stride = head_rows;
  for (int64_t m = 1; m <= 5; ++m) {
    a.m = m;
    a.wt = DenseType::BF16;
    EXPECT_EQ(gpu::raw::dense_ring_takes(a), m <= 4) << "m=" << m;
    a.wt = DenseType::F32;
    EXPECT_FALSE(gpu::raw::dense_ring_takes(a)) << "fp32 m=" << m;
  }
  a.m = 1;
  a.wt = DenseType::BF16;
  a.out = 1100;  // 35 tiles: four warps each leave most SMs without a CTA
  EXPECT_FALSE(gpu::raw::dense_ring_takes(a)) << "few rows keep the tiled kernel's K split";
  a.in = 4096;  // wo_a: 8 groups of 1,024 rows (a split of four)
  a.out = 1024;
  a.groups = 8;
  a.x_stride = 8 * 4096;
  a.y_stride = 8 * 1024;
  EXPECT_TRUE(gpu::raw::dense_ring_takes(a)) << "wo_a";
  for (int64_t m : {1, 4}) dense_case(DenseType::BF16, 1032, head_rows, 1, m, 0, false);
  for (int64_t m : {1, 2, 3, 4}) dense_case(DenseType::BF16, 4096, 1024, 8, m, 0, true);
}

}  // namespace
}  // namespace dsv41::test
