// GPU parity of the attention index lists and the staged window, run end to end with the sparse
// attention kernels against the CPU reference's row lists (CpuModel::Impl::attention restated:
// decode ring order with the new row in its slot; prefill position order over ring + chunk rows;
// the top-k tail), plus the token embedding, the greedy argmax, and the dense scalar path.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "harness.h"
#include "model/ops/quant.h"
#include "model/ops/sparse_attn.h"

namespace dsv41::test {
namespace {

namespace gpu = ops::gpu;

std::vector<float> kv_rows(Rng& rng, int64_t rows, int64_t hd) {
  std::vector<float> v = rng.bf16_vec(static_cast<size_t>(rows * hd));
  for (int64_t r = 0; r < rows; ++r) model::qdq8_inplace(&v[r * hd], hd);
  return v;
}

std::vector<int32_t> random_topk(Rng& rng, int64_t n, int64_t k, int64_t n_entries) {
  std::vector<int32_t> t(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) {
    const int64_t r = rng.below(10);
    t[i] = r == 0 ? -1 : (r == 1 ? static_cast<int32_t>(n_entries + rng.below(5)) : static_cast<int32_t>(rng.below(n_entries)));
  }
  return t;
}

// Prefill chunk at `start` with n queries, list layout of a prompt ending at layout_end.
void run_prefill_chain(const Shapes& s, int64_t start, int64_t n, int64_t layout_end) {
  const ModelConfig& c = s.cfg;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, win = c.sliding_window, tk = c.index_topk, n_entries = 2 * tk;
  const std::string what = s.name + " attn chain prefill start=" + std::to_string(start) + " n=" + std::to_string(n);
  SCOPED_TRACE(what);
  Rng rng(static_cast<uint64_t>(start * 7 + n));
  std::vector<float> ring = kv_rows(rng, win, hd), kv = kv_rows(rng, n, hd), comp = kv_rows(rng, n_entries, hd);
  std::vector<float> q = rng.bf16_vec(static_cast<size_t>(n * H * hd)), sink = rng.f32_vec(static_cast<size_t>(H));
  std::vector<int32_t> topk = random_topk(rng, n, tk, n_entries);
  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  const int64_t len = std::min(layout_end, win), pos_base = std::max<int64_t>(0, start - win + 1);
  const int64_t split = start - pos_base + n, list_len = len + tk;
  // reference rows and the expected encoded list
  std::vector<float> want(static_cast<size_t>(n * H * hd));
  std::vector<int32_t> want_list;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = start + t, first = std::max<int64_t>(0, p - win + 1);
    std::vector<const float*> rows;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t pos = first + j;
      rows.push_back(pos > p ? nullptr : (pos >= start ? &kv[(pos - start) * hd] : &ring[(pos % win) * hd]));
      want_list.push_back(pos > p ? -1 : static_cast<int32_t>(pos - pos_base));
    }
    for (int64_t j = 0; j < tk; ++j) {
      const int32_t e = topk[t * tk + j];
      const bool bad = e < 0 || e >= n_entries;
      rows.push_back(bad ? nullptr : &comp[static_cast<size_t>(e) * hd]);
      want_list.push_back(bad ? -1 : static_cast<int32_t>(e + split));
    }
    model::sparse_attention(&q[t * H * hd], rows, sink.data(), scale, H, hd, &want[t * H * hd]);
  }
  DeviceBuffer dring = DeviceBuffer::from(to_bf16_bits(ring)), dkv = DeviceBuffer::from(to_bf16_bits(kv));
  DeviceBuffer dcomp = DeviceBuffer::from(to_bf16_bits(comp)), dq = DeviceBuffer::from(q), dsink = DeviceBuffer::from(sink);
  DeviceBuffer dtopk = DeviceBuffer::from(topk);
  Guarded dstaged(static_cast<size_t>(split * hd) * 2), dlist(static_cast<size_t>(n * list_len) * 4), dout(want.size() * 4);
  gpu::StageWindowArgs sw;
  sw.ring = dring.as<uint16_t>();
  sw.kv = dkv.as<uint16_t>();
  sw.start = start;
  sw.n = n;
  sw.win = win;
  sw.d = hd;
  sw.out = dstaged.as<uint16_t>();
  gpu::stage_window(sw, nullptr);
  gpu::AttnListArgs la;
  la.list = dlist.as<int32_t>();
  la.n = n;
  la.win = win;
  la.win_len = len;
  la.start = start;
  la.pos_base = pos_base;
  la.split = split;
  la.topk = dtopk.as<int32_t>();
  la.topk_len = tk;
  la.n_entries = n_entries;
  gpu::attn_lists(la, nullptr);
  std::vector<const uint16_t*> pa(static_cast<size_t>(n), dstaged.as<uint16_t>()), pb(static_cast<size_t>(n), dcomp.as<uint16_t>());
  DeviceBuffer dpa = DeviceBuffer::from(pa), dpb = DeviceBuffer::from(pb);
  gpu::SparseAttnArgs a;
  a.q = dq.as<float>();
  a.list = dlist.as<int32_t>();
  a.list_len = list_len;
  a.pool_a = dpa.as<const uint16_t*>();
  a.pool_b = dpb.as<const uint16_t*>();
  a.split = split;
  a.sink = dsink.as<float>();
  a.scale = scale;
  a.n_q = n;
  a.heads = H;
  a.d = hd;
  a.out = dout.as<float>();
  gpu::sparse_attention_prefill(a, nullptr);
  sync_ok();
  expect_equal(what + " list", dlist.host<int32_t>(), want_list);
  expect_close(what + " out", dout.host<float>(), want, kNmseBf16);
  for (const Guarded* g : {&dstaged, &dlist, &dout}) expect_guards(what, *g);
}

TEST(GpuOps, AttentionChainPrefill) {
  for (const Shapes& s : shape_sets()) {
    const int64_t win = s.cfg.sliding_window;
    run_prefill_chain(s, 0, win + 20, win + 20);   // one-shot prompt longer than the window
    run_prefill_chain(s, 0, 7, 12);                // chunk of a prompt whose length is known
    run_prefill_chain(s, win + 13, 5, win + 18);   // later chunk: ring + chunk rows
  }
}

TEST(GpuOps, AttentionChainDecode) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t H = c.num_attention_heads, hd = c.head_dim, win = c.sliding_window, tk = c.index_topk, n = 3;
    const std::string what = s.name + " attn chain decode batch=3";
    SCOPED_TRACE(what);
    Rng rng(17);
    const std::vector<int64_t> pos = {5, win + 40, 3 * win + 1};  // ring still filling, full, wrapped
    const int64_t n_entries = tk + 9;
    std::vector<std::vector<float>> rings, comps;
    std::vector<float> kv = kv_rows(rng, n, hd), q = rng.bf16_vec(static_cast<size_t>(n * H * hd));
    std::vector<float> sink = rng.f32_vec(static_cast<size_t>(H));
    std::vector<int32_t> topk = random_topk(rng, n, tk, n_entries);
    const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
    std::vector<float> want(static_cast<size_t>(n * H * hd));
    for (int64_t t = 0; t < n; ++t) {
      rings.push_back(kv_rows(rng, win, hd));
      comps.push_back(kv_rows(rng, n_entries, hd));
      const int64_t p = pos[t], cur = p % win;
      std::vector<const float*> rows;
      for (int64_t i = 0; i < win; ++i) {
        const int64_t slot = (cur + 1 + i) % win;
        rows.push_back(slot > p ? nullptr : (slot == cur ? &kv[t * hd] : &rings[t][slot * hd]));
      }
      for (int64_t j = 0; j < tk; ++j) {
        const int32_t e = topk[t * tk + j];
        rows.push_back(e < 0 || e >= n_entries ? nullptr : &comps[t][static_cast<size_t>(e) * hd]);
      }
      model::sparse_attention(&q[t * H * hd], rows, sink.data(), scale, H, hd, &want[t * H * hd]);
      std::copy_n(&kv[t * hd], hd, &rings[t][cur * hd]);  // the engine writes the new row first
    }
    std::vector<DeviceBuffer> dr, dc;
    std::vector<const uint16_t*> pa, pb;
    for (int64_t t = 0; t < n; ++t) {
      dr.push_back(DeviceBuffer::from(to_bf16_bits(rings[t])));
      dc.push_back(DeviceBuffer::from(to_bf16_bits(comps[t])));
      pa.push_back(dr.back().as<uint16_t>());
      pb.push_back(dc.back().as<uint16_t>());
    }
    DeviceBuffer dpa = DeviceBuffer::from(pa), dpb = DeviceBuffer::from(pb), dpos = DeviceBuffer::from(pos);
    DeviceBuffer dq = DeviceBuffer::from(q), dsink = DeviceBuffer::from(sink), dtopk = DeviceBuffer::from(topk);
    Guarded dlist(static_cast<size_t>(n * (win + tk)) * 4), dout(want.size() * 4);
    gpu::AttnListArgs la;
    la.list = dlist.as<int32_t>();
    la.n = n;
    la.win = win;
    la.win_len = win;
    la.decode = true;
    la.positions = dpos.as<int64_t>();
    la.split = win;
    la.topk = dtopk.as<int32_t>();
    la.topk_len = tk;
    la.n_entries = n_entries;
    gpu::attn_lists(la, nullptr);
    gpu::SparseAttnArgs a;
    a.q = dq.as<float>();
    a.list = dlist.as<int32_t>();
    a.list_len = win + tk;
    a.pool_a = dpa.as<const uint16_t*>();
    a.pool_b = dpb.as<const uint16_t*>();
    a.split = win;
    a.sink = dsink.as<float>();
    a.scale = scale;
    a.n_q = n;
    a.heads = H;
    a.d = hd;
    a.out = dout.as<float>();
    gpu::sparse_attention_decode(a, nullptr);
    sync_ok();
    expect_close(what, dout.host<float>(), want, kNmseBf16);
    expect_guards(what, dlist);
    expect_guards(what, dout);
  }
}

TEST(GpuOps, EmbedAndArgmax) {
  for (const Shapes& s : shape_sets()) {
    const ModelConfig& c = s.cfg;
    const int64_t vocab = c.vocab_size, dim = c.hidden_size, hc = c.hc_mult;
    const std::string what = s.name + " embed/argmax";
    SCOPED_TRACE(what);
    Rng rng(8);
    // a slice of the table is enough: the kernel indexes rows by id
    const int64_t rows_held = std::min<int64_t>(vocab, 1000);
    std::vector<float> table = rng.bf16_vec(static_cast<size_t>(rows_held * dim));
    std::vector<int32_t> tokens = {0, static_cast<int32_t>(rows_held - 1), 17, static_cast<int32_t>(rows_held), -1};
    std::vector<float> want(static_cast<size_t>(tokens.size() * hc * dim));
    for (size_t t = 0; t < tokens.size(); ++t)
      for (int64_t j = 0; j < hc; ++j)
        for (int64_t d = 0; d < dim; ++d)
          want[(t * hc + j) * dim + d] = tokens[t] >= 0 && tokens[t] < rows_held ? table[tokens[t] * dim + d] : NAN;
    DeviceBuffer dtable = DeviceBuffer::from(to_bf16_bits(table)), dtok = DeviceBuffer::from(tokens);
    Guarded dout(want.size() * 4, 0x00), dpre(tokens.size() * static_cast<size_t>(hc) * 4, 0x7F);
    std::vector<float> want_pre(tokens.size() * static_cast<size_t>(hc), 0.0f);
    for (size_t t = 0; t < tokens.size(); ++t) want_pre[t * static_cast<size_t>(hc)] = 1.0f;
    gpu::EmbedArgs ea;
    ea.table = dtable.as<uint16_t>();
    ea.vocab = rows_held;
    ea.dim = dim;
    ea.hc = hc;
    ea.tokens = dtok.as<int32_t>();
    ea.n = static_cast<int64_t>(tokens.size());
    ea.out = dout.as<float>();
    ea.pre_out = dpre.as<float>();
    gpu::embed(ea, nullptr);
    sync_ok();
    expect_close(what + " embed", dout.host<float>(), want, 0.0);
    expect_guards(what, dout);
    expect_close(what + " embed pre", dpre.host<float>(), want_pre, 0.0);
    expect_guards(what + " pre", dpre);

    const int64_t rows = 4;
    std::vector<float> logits = rng.f32_vec(static_cast<size_t>(rows * vocab), 3.0f);
    logits[static_cast<size_t>(vocab + 100)] = 50.0f;  // tie: the first one wins
    logits[static_cast<size_t>(vocab + vocab - 3)] = 50.0f;
    logits[static_cast<size_t>(2 * vocab + vocab / 2)] = NAN;  // NaN counts as the maximum
    std::vector<int32_t> want_idx;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = &logits[r * vocab];
      int64_t best = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isnan(x[best])) break;
        if (std::isnan(x[i]) || x[i] > x[best]) best = i;
      }
      want_idx.push_back(static_cast<int32_t>(best));
    }
    DeviceBuffer dl = DeviceBuffer::from(logits);
    Guarded didx(static_cast<size_t>(rows) * 4);
    gpu::ArgmaxArgs aa;
    aa.x = dl.as<float>();
    aa.rows = rows;
    aa.n = vocab;
    aa.out = didx.as<int32_t>();
    gpu::argmax(aa, nullptr);
    sync_ok();
    expect_equal(what + " argmax", didx.host<int32_t>(), want_idx);
    expect_guards(what, didx);

    // The host sampler's rule (std::max_element): NaN never wins over a number; a NaN first
    // element is kept, as is index 0 of an all-NaN row.
    std::vector<float> with_nan_rows = logits;
    with_nan_rows.resize(static_cast<size_t>((rows + 1) * vocab), NAN);  // row 4: all NaN
    with_nan_rows[static_cast<size_t>(3 * vocab)] = NAN;                 // row 3: NaN first
    with_nan_rows[static_cast<size_t>(vocab + 7)] = NAN;                 // row 1: NaN before the tie
    std::vector<int32_t> want_max_element;
    for (int64_t r = 0; r <= rows; ++r) {
      const float* x = &with_nan_rows[r * vocab];
      want_max_element.push_back(static_cast<int32_t>(std::max_element(x, x + vocab) - x));
    }
    ASSERT_EQ(want_max_element[3], 0);
    ASSERT_EQ(want_max_element[4], 0);
    DeviceBuffer dn = DeviceBuffer::from(with_nan_rows);
    Guarded dme(static_cast<size_t>(rows + 1) * 4);
    gpu::ArgmaxArgs me = aa;
    me.x = dn.as<float>();
    me.rows = rows + 1;
    me.out = dme.as<int32_t>();
    me.skip_nan = true;
    gpu::argmax(me, nullptr);
    sync_ok();
    expect_equal(what + " argmax (max_element)", dme.host<int32_t>(), want_max_element);
    expect_guards(what, dme);
    if (s.name == "real") report_time(what + " argmax rows=4", time_us([&] { gpu::argmax(aa, nullptr); }));
  }
}

}  // namespace
}  // namespace dsv41::test
