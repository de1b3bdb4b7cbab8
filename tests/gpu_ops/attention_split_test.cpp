// GPU parity of the decode-shaped attention kernels: the split sparse attention kernel (one cluster
// of blocks per query and head group) must give the same bits as the rows kernel (one block walks
// the list, the reference's loop restated) and match the CPU reference; the tiled indexer must give
// exactly the CPU reference's scores. Shapes beyond the model's own: lists that are not a multiple
// of the 64-entry chunk, chunks with no valid entry, head counts that are not a multiple of the
// kernels' head groups, d and index head_dim with a partial second 256-wide K block, scores whose
// running maximum rises from chunk to chunk (c < 1 in the recurrences). Every variant of the split
// kernel and of the tiled indexer runs every case.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "harness.h"
#include "model/ops/dot.h"
#include "model/ops/quant.h"
#include "model/ops/sparse_attn.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

struct AttnCase {
  int64_t n_q, heads, d, list_len;
  float q_sd;
};

// Runs one case through both kernels and the CPU reference.
void run_split_case(const AttnCase& k, uint64_t seed) {
  const int64_t n_q = k.n_q, H = k.heads, d = k.d, L = k.list_len, n_rows = L + 9;
  const std::string what = "split n_q=" + std::to_string(n_q) + " H=" + std::to_string(H) + " d=" + std::to_string(d) +
                           " L=" + std::to_string(L);
  SCOPED_TRACE(what);
  Rng rng(seed);
  const int64_t split = n_rows / 3;
  std::vector<std::vector<float>> pool(static_cast<size_t>(n_q));
  for (int64_t t = 0; t < n_q; ++t) {
    pool[t] = rng.bf16_vec(static_cast<size_t>(n_rows * d));
    // rows further down the list get larger: the running max rises chunk after chunk
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < d; ++i) pool[t][r * d + i] = bf16_round(pool[t][r * d + i] * (1.0f + 0.004f * r));
  }
  std::vector<float> q = rng.bf16_vec(static_cast<size_t>(n_q * H * d), k.q_sd), sink = rng.f32_vec(static_cast<size_t>(H), 2.0f);
  std::vector<int32_t> list(static_cast<size_t>(n_q * L));
  for (int64_t t = 0; t < n_q; ++t)
    for (int64_t j = 0; j < L; ++j) {
      int32_t e = static_cast<int32_t>(j % n_rows);
      if (rng.below(9) == 0) e = -1;
      if (j >= 64 && j < 128) e = -1;  // a whole chunk without a valid entry
      list[t * L + j] = e;
    }
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  std::vector<float> want(static_cast<size_t>(n_q * H * d));
  for (int64_t t = 0; t < n_q; ++t) {
    std::vector<const float*> rows;
    for (int64_t j = 0; j < L; ++j) {
      const int32_t e = list[t * L + j];
      rows.push_back(e < 0 ? nullptr : &pool[t][e * d]);
    }
    model::sparse_attention(&q[t * H * d], rows, sink.data(), scale, H, d, &want[t * H * d]);
  }
  // pool_a holds rows < split, pool_b the rest (entry e >= split names row e - split of pool_b)
  std::vector<DeviceBuffer> dpool;
  std::vector<const uint16_t*> pa, pb;
  for (int64_t t = 0; t < n_q; ++t) {
    dpool.push_back(DeviceBuffer::from(to_bf16_bits(pool[t])));
    pa.push_back(dpool.back().as<uint16_t>());
    pb.push_back(dpool.back().as<uint16_t>() + split * d);
  }
  DeviceBuffer dq = DeviceBuffer::from(q), dsink = DeviceBuffer::from(sink), dlist = DeviceBuffer::from(list);
  DeviceBuffer dpa = DeviceBuffer::from(pa), dpb = DeviceBuffer::from(pb);
  Guarded o_rows(want.size() * 4);
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
  ASSERT_EQ(gpu::raw::sparse_attention_rows(a, 1, nullptr), cudaSuccess);
  sync_ok();
  const std::vector<float> rows_out = o_rows.host<float>();
  expect_close(what + " rows vs cpu", rows_out, want, kNmseBf16);
  expect_guards(what, o_rows);
  // The chosen split kernel, then every variant (-1: sparse_attention_split's own choice, which
  // falls back to the others: it must run where the smallest layout fits). A variant runs where its
  // layout fits the device's shared memory and is refused beyond it (GB10: the decode list of 640
  // in clusters of 8), with nothing launched; on the H200 every case and variant runs.
  size_t smallest = SIZE_MAX;
  for (int v = 0; v < gpu::raw::sparse_attention_split_variants(); ++v)
    smallest = std::min(smallest, gpu::raw::sparse_attention_split_smem(a, v));
  for (int v = -1; v < gpu::raw::sparse_attention_split_variants(); ++v) {
    const std::string name = what + " " + (v < 0 ? std::string("default") : gpu::raw::sparse_attention_split_variant_name(v));
    Guarded o_split(want.size() * 4);
    a.out = o_split.as<float>();
    const cudaError_t e = v < 0 ? gpu::raw::sparse_attention_split(a, nullptr) : gpu::raw::sparse_attention_split_variant(a, v, nullptr);
    expect_smem_outcome(name, e, v < 0 ? smallest : gpu::raw::sparse_attention_split_smem(a, v), cudaErrorNotSupported);
    if (e != cudaSuccess) {
      sync_ok();
      EXPECT_TRUE(o_split.poisoned()) << name << ": a refused launch wrote outputs";
      expect_guards(name + " (refused)", o_split);
      continue;  // the other variants still run
    }
    sync_ok();
    const std::vector<float> got = o_split.host<float>();
    expect_equal(name + " vs rows", got, rows_out);
    expect_close(name + " vs cpu", got, want, kNmseBf16);
    expect_guards(name, o_split);
  }
}

TEST(GpuOps, SparseAttentionSplitMatchesRows) {
  const ModelConfig& real = shape_sets()[0].cfg;
  const ModelConfig& tiny = shape_sets()[1].cfg;
  const int64_t real_len = real.sliding_window + real.index_topk, tiny_len = tiny.sliding_window + tiny.index_topk;
  const std::vector<AttnCase> cases = {
      {1, real.num_attention_heads, real.head_dim, real_len, 1.0f},
      {2, real.num_attention_heads, real.head_dim, real_len, 4.0f},
      {4, real.num_attention_heads, real.head_dim, real_len - 1, 1.0f},
      {1, tiny.num_attention_heads, tiny.head_dim, tiny_len, 1.0f},
      {3, 6, 136, 1, 1.0f},     // one entry; 6 heads = a full and a half head group; 17 lane pairs
      {1, 5, 264, 65, 2.0f},    // second K block of 8 values; chunk 2 holds one entry
      {2, 3, 8, 130, 1.0f},     // d smaller than the cluster's lanes
      {1, 64, 512, 1024, 1.0f}  // the longest list the split kernel takes
  };
  uint64_t seed = 11;
  for (const AttnCase& k : cases) run_split_case(k, seed++);
}

// Indexer: tiled kernel vs the CPU loop of CpuModel (attention.cpp), exact.
struct IdxCase {
  int64_t n, heads, head_dim, start, ratio, T, n_keys;
};

void run_indexer_case(const IdxCase& k, uint64_t seed) {
  const int64_t n = k.n, IH = k.heads, ID = k.head_dim, T = k.T;
  const std::string what = "indexer tiled n=" + std::to_string(n) + " IH=" + std::to_string(IH) + " ID=" + std::to_string(ID) +
                           " T=" + std::to_string(T) + " keys=" + std::to_string(k.n_keys);
  SCOPED_TRACE(what);
  Rng rng(seed);
  auto qdq_rows = [&](std::vector<float> v) {
    for (size_t r = 0; r < v.size() / ID; ++r) model::qdq4a_inplace(&v[r * ID], ID);
    return v;
  };
  const std::vector<float> qi = qdq_rows(rng.bf16_vec(static_cast<size_t>(n * IH * ID)));
  const std::vector<float> keys = qdq_rows(rng.bf16_vec(static_cast<size_t>(std::max<int64_t>(k.n_keys, 1) * ID)));
  const std::vector<float> w = rng.bf16_vec(static_cast<size_t>(n * IH), 0.1f);
  std::vector<float> want(static_cast<size_t>(n * T));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t n_vis = (k.start + t + 1) / k.ratio;
    for (int64_t u = 0; u < T; ++u) {
      if (u >= n_vis) {
        want[t * T + u] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float acc = 0.0f;
      for (int64_t h = 0; h < IH; ++h) {
        float dot = 0.0f;
        if (u < k.n_keys) dot = model::gemm_dot_f32(&qi[(t * IH + h) * ID], &keys[u * ID], ID);
        const float r = std::max(bf16_round(dot), 0.0f);
        acc += bf16_round(r * w[t * IH + h]);
      }
      want[t * T + u] = bf16_round(acc);
    }
  }
  DeviceBuffer dq = DeviceBuffer::from(qi), dw = DeviceBuffer::from(w), dk = DeviceBuffer::from(to_bf16_bits(keys));
  gpu::IndexerArgs a;
  a.qi = dq.as<float>();
  a.w = dw.as<float>();
  a.keys = k.n_keys > 0 ? dk.as<uint16_t>() : nullptr;
  a.n_keys = k.n_keys;
  a.n = n;
  a.heads = IH;
  a.head_dim = ID;
  a.T = T;
  a.start = k.start;
  a.ratio = k.ratio;
  // The chosen tiled kernel, then every variant (-1: indexer_scores_tiled's own choice).
  for (int v = -1; v < gpu::raw::indexer_scores_tiled_variants(); ++v) {
    const std::string name = what + " " + (v < 0 ? std::string("default") : gpu::raw::indexer_scores_tiled_variant_name(v));
    Guarded ds(want.size() * 4);
    a.scores = ds.as<float>();
    const cudaError_t e = v < 0 ? gpu::raw::indexer_scores_tiled(a, nullptr) : gpu::raw::indexer_scores_tiled_variant(a, v, nullptr);
    EXPECT_EQ(e, cudaSuccess) << name << ": the H200 takes every case and variant here";
    if (e != cudaSuccess) continue;  // the other variants still run
    sync_ok();
    expect_equal(name, ds.host<float>(), want);
    expect_guards(name, ds);
  }
}

TEST(GpuOps, IndexerTiledExact) {
  const ModelConfig& real = shape_sets()[0].cfg;
  const ModelConfig& tiny = shape_sets()[1].cfg;
  const int64_t IH = real.index_n_heads, ID = real.index_head_dim;
  const std::vector<IdxCase> cases = {
      {1, IH, ID, 9000, 2, 4501, 4497},                                        // decode: last tile partly visible
      {4, IH, ID, 2047, 2, 1030, 1025},                                        // several queries, keys end early
      {9, IH, ID, 100, 2, 200, 40},                                            // most tiles invisible
      {2, tiny.index_n_heads, tiny.index_head_dim, 70, 2, 40, 36},             // the tiny model's shapes
      {3, 5, 264, 300, 1, 303, 290},                                           // odd head count, partial K block
      {2, 128, 64, 129, 1, 131, 131},                                          // the most heads the tiled kernel takes
      {2, IH, ID, 50, 2, 30, 0},                                               // no keys yet: every dot is 0
  };
  uint64_t seed = 40;
  for (const IdxCase& k : cases) run_indexer_case(k, seed++);
}

}  // namespace
}  // namespace dsv41::test
