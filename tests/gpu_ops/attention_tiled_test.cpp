// GPU parity of the prefill sparse attention kernel (sparse_attn_tiled.cuh: one block per query and
// group of 32 heads, or of 8 in its narrow form, all heads of a chunk at once): it must give the
// same bits as the rows kernel (one block walks the list per head, the reference's loop restated)
// and match the CPU reference.
// Shapes beyond the model's own: head counts that are not a multiple of the 32-head group, d with a
// partial second 256-wide K block and d below one K block, lists that are not a multiple of the
// 64-entry chunk (tail chunks of 1 and 2 entries), chunks without a valid entry, a list with no
// valid entry at all, rows missing from pool_b, the window shared by neighbouring queries (one pool,
// position-ordered lists, as a prefill pass stages it), and scores whose running maximum rises
// from chunk to chunk (c < 1 in the recurrences) or falls (c = 1).
#include <gtest/gtest.h>

#include <algorithm>

#include "harness.h"
#include "model/ops/sparse_attn.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

struct TiledCase {
  int64_t n_q, heads, d, list_len;
  float q_sd;
  bool rising;      // rows further down the pool get larger
  bool no_pool_b;   // pool_b pointers are null: entries >= split are skipped
};

void run_tiled_case(const TiledCase& k, uint64_t seed) {
  const int64_t n_q = k.n_q, H = k.heads, d = k.d, L = k.list_len;
  const int64_t n_rows = L + n_q + 9, split = std::max<int64_t>(1, n_rows / 3);
  const std::string what = "tiled n_q=" + std::to_string(n_q) + " H=" + std::to_string(H) + " d=" + std::to_string(d) +
                           " L=" + std::to_string(L);
  SCOPED_TRACE(what);
  Rng rng(seed);
  // One pool for the whole pass: query t's list walks rows t, t+1, ... (neighbours share rows).
  std::vector<float> pool = rng.bf16_vec(static_cast<size_t>(n_rows * d));
  if (k.rising)
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < d; ++i) pool[r * d + i] = bf16_round(pool[r * d + i] * (1.0f + 0.004f * r));
  std::vector<float> q = rng.bf16_vec(static_cast<size_t>(n_q * H * d), k.q_sd), sink = rng.f32_vec(static_cast<size_t>(H), 2.0f);
  std::vector<int32_t> list(static_cast<size_t>(n_q * L));
  for (int64_t t = 0; t < n_q; ++t)
    for (int64_t j = 0; j < L; ++j) {
      int32_t e = static_cast<int32_t>(t + j);
      if (rng.below(9) == 0) e = -1;
      if (j >= 64 && j < 128) e = -1;  // a whole chunk without a valid entry
      list[t * L + j] = e;
    }
  if (n_q > 2)  // one query with nothing valid at all: output 0
    for (int64_t j = 0; j < L; ++j) list[(n_q / 2) * L + j] = -1;
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  std::vector<float> want(static_cast<size_t>(n_q * H * d));
  for (int64_t t = 0; t < n_q; ++t) {
    std::vector<const float*> rows;
    for (int64_t j = 0; j < L; ++j) {
      const int32_t e = list[t * L + j];
      rows.push_back(e < 0 || (k.no_pool_b && e >= split) ? nullptr : &pool[e * d]);
    }
    model::sparse_attention(&q[t * H * d], rows, sink.data(), scale, H, d, &want[t * H * d]);
  }
  DeviceBuffer dpool = DeviceBuffer::from(to_bf16_bits(pool));
  std::vector<const uint16_t*> pa(static_cast<size_t>(n_q), dpool.as<uint16_t>());
  std::vector<const uint16_t*> pb(static_cast<size_t>(n_q), k.no_pool_b ? nullptr : dpool.as<uint16_t>() + split * d);
  DeviceBuffer dq = DeviceBuffer::from(q), dsink = DeviceBuffer::from(sink), dlist = DeviceBuffer::from(list);
  DeviceBuffer dpa = DeviceBuffer::from(pa), dpb = DeviceBuffer::from(pb);
  Guarded o_tiled(want.size() * 4), o_rows(want.size() * 4);
  gpu::SparseAttnArgs a;
  a.q = dq.as<float>();
  a.list = dlist.as<int32_t>();
  a.list_len = L;
  a.pool_a = dpa.as<const uint16_t*>();
  a.pool_b = dpb.as<const uint16_t*>();
  a.split = split;
  a.sink = dsink.as<float>();
  a.scale = scale;
  a.n_q = n_q;
  a.heads = H;
  a.d = d;
  a.out = o_rows.as<float>();
  ASSERT_EQ(gpu::raw::sparse_attention_rows(a, gpu::kPrefillHeads, nullptr), cudaSuccess);
  sync_ok();
  const std::vector<float> rows_out = o_rows.host<float>();
  expect_close(what + " rows vs cpu", rows_out, want, kNmseBf16);
  // Each form (wide: 32 heads, two buffers; narrow: 8 heads, one) and the automatic choice: the
  // rows kernel's bits where the form fits the device's shared memory (every case on the H200; the
  // narrow form only at d = 512 under GB10's 99 KB), refused with nothing launched beyond it.
  size_t smallest = SIZE_MAX;
  for (int v = 0; v < gpu::raw::sparse_attention_tiled_variants(); ++v)
    smallest = std::min(smallest, gpu::raw::sparse_attention_tiled_variant_smem(d, v));
  for (int v = -1; v < gpu::raw::sparse_attention_tiled_variants(); ++v) {
    const std::string name = what + (v < 0 ? std::string(" automatic") : " form " + std::to_string(v));
    o_tiled.poison();
    a.out = o_tiled.as<float>();
    const cudaError_t e =
        v < 0 ? gpu::raw::sparse_attention_tiled(a, nullptr) : gpu::raw::sparse_attention_tiled_variant(a, v, nullptr);
    const size_t bytes = v < 0 ? smallest : gpu::raw::sparse_attention_tiled_variant_smem(d, v);
    expect_smem_outcome(name, e, bytes, cudaErrorNotSupported);
    sync_ok();
    if (e == cudaSuccess) {
      const std::vector<float> got = o_tiled.host<float>();
      expect_equal(name + " vs rows", got, rows_out);
      expect_close(name + " vs cpu", got, want, kNmseBf16);
    } else {
      EXPECT_TRUE(o_tiled.poisoned()) << name << ": a refused launch wrote outputs";
    }
    expect_guards(name, o_tiled);
  }
  expect_guards(what, o_rows);
}

TEST(GpuOps, SparseAttentionTiledMatchesRows) {
  const ModelConfig& real = shape_sets()[0].cfg;
  const ModelConfig& tiny = shape_sets()[1].cfg;
  const int64_t real_len = real.sliding_window + real.index_topk, tiny_len = tiny.sliding_window + tiny.index_topk;
  const std::vector<TiledCase> cases = {
      {5, real.num_attention_heads, real.head_dim, real_len, 1.0f, false, false},
      {3, real.num_attention_heads, real.head_dim, real_len + 1, 4.0f, true, false},  // a 1-entry tail chunk
      {40, tiny.num_attention_heads, tiny.head_dim, tiny_len, 1.0f, false, false},
      {3, 33, 264, 130, 2.0f, true, false},  // a full and a 1-head group; 8-value second K block; 2-entry tail
      {4, 7, 8, 65, 1.0f, false, true},      // d of one vector; pool_b missing
      {2, 5, 136, 1, 1.0f, false, false},    // one entry
      {3, 64, 512, 200, 0.05f, false, false},  // flat scores
  };
  uint64_t seed = 70;
  for (const TiledCase& k : cases) run_tiled_case(k, seed++);
}

// The prefill entry point on a pass of many queries (the tiled kernel) against the rows kernel and,
// for its first queries, the CPU reference.
TEST(GpuOps, SparseAttentionPrefillPassUsesTiled) {
  const ModelConfig& real = shape_sets()[0].cfg;
  const int64_t H = real.num_attention_heads, d = real.head_dim, L = real.sliding_window + real.index_topk, n_q = 48;
  Rng rng(91);
  const int64_t n_rows = L + n_q;
  std::vector<float> pool = rng.bf16_vec(static_cast<size_t>(n_rows * d));
  std::vector<float> q = rng.bf16_vec(static_cast<size_t>(n_q * H * d)), sink = rng.f32_vec(static_cast<size_t>(H));
  std::vector<int32_t> list(static_cast<size_t>(n_q * L));
  for (int64_t t = 0; t < n_q; ++t)
    for (int64_t j = 0; j < L; ++j) list[t * L + j] = rng.below(11) == 0 ? -1 : static_cast<int32_t>(t + j);
  DeviceBuffer dpool = DeviceBuffer::from(to_bf16_bits(pool));
  std::vector<const uint16_t*> pa(static_cast<size_t>(n_q), dpool.as<uint16_t>());
  DeviceBuffer dq = DeviceBuffer::from(q), dsink = DeviceBuffer::from(sink), dlist = DeviceBuffer::from(list);
  DeviceBuffer dpa = DeviceBuffer::from(pa);
  Guarded o_pass(static_cast<size_t>(n_q * H * d) * 4), o_rows(static_cast<size_t>(n_q * H * d) * 4);
  gpu::SparseAttnArgs a;
  a.q = dq.as<float>();
  a.list = dlist.as<int32_t>();
  a.list_len = L;
  a.pool_a = dpa.as<const uint16_t*>();
  a.split = n_rows;
  a.sink = dsink.as<float>();
  a.scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  a.n_q = n_q;
  a.heads = H;
  a.d = d;
  a.out = o_pass.as<float>();
  gpu::sparse_attention_prefill(a, nullptr);
  a.out = o_rows.as<float>();
  ASSERT_EQ(gpu::raw::sparse_attention_rows(a, gpu::kPrefillHeads, nullptr), cudaSuccess);
  sync_ok();
  const std::vector<float> got = o_pass.host<float>();
  expect_equal("prefill pass vs rows", got, o_rows.host<float>());
  expect_guards("prefill pass", o_pass);
  expect_guards("rows", o_rows);
  const int64_t n_cpu = 3;  // the first queries of the pass against the CPU reference
  std::vector<float> want(static_cast<size_t>(n_cpu * H * d));
  for (int64_t t = 0; t < n_cpu; ++t) {
    std::vector<const float*> rows;
    for (int64_t j = 0; j < L; ++j) rows.push_back(list[t * L + j] < 0 ? nullptr : &pool[list[t * L + j] * d]);
    model::sparse_attention(&q[t * H * d], rows, sink.data(), a.scale, H, d, &want[t * H * d]);
  }
  expect_close("prefill pass first queries vs cpu", std::vector<float>(got.begin(), got.begin() + n_cpu * H * d), want,
               kNmseBf16);
  a.out = o_pass.as<float>();
  report_time("sparse_attn prefill pass n_q=" + std::to_string(n_q), time_us([&] { gpu::sparse_attention_prefill(a, nullptr); }));
}

}  // namespace
}  // namespace dsv41::test
