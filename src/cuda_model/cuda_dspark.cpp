// The DSpark drafter on the GPU (MODEL.md §6), step for step as the CPU engine's
// src/model/cpu_model.cpp (update_dspark_rings, dspark_draft) and block.cpp (dspark_attention):
//  - taps: the stream mean of every target layer's input, captured during the target forward;
//  - rings: RMSNorm(main_norm, Lin(main_proj, taps)) -> per stage QDQ8(RoPE(RMSNorm(kv_norm,
//    Lin(wkv)))) into slot p mod window, for the last min(n, window) positions of each pass;
//  - draft: the block [anchor, noise ..] through the stages (each block row attends to the ring
//    slots 0 .. min(window, n_past)-1 in slot order and to every block row), collapse, norm, head,
//    then row by row the Markov bias of the previous row's choice and the greedy pick, on the
//    device; the confidence logits on the host in the CPU engine's summation order.
// Several sequences draft in one pass: their rows are independent everywhere except in attention
// (one launch per sequence over its own ring) and the mHC mixes (one call per sequence: the
// reference's row count of a block call decides the sigmoid path).
#include "cuda_model/cuda_dspark.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cmath>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/exl3/exl3_linear.h"
#include "model/cpu_impl.h"
#include "model/linears.h"

namespace dsv41::model::cuda {
namespace gpu = ops::gpu;

namespace {

bool all_bf16(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float f) { return std::isnan(f) || bf16_round(f) == f; });
}

// BF16 bits when every value is a bf16 value (the kernels widen to the same fp32), else F32.
DeviceBuffer upload_values(const std::vector<float>& v, DenseType& type) {
  if (all_bf16(v)) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16_bits(v[i]);
    type = DenseType::BF16;
    return DeviceBuffer::from(b);
  }
  type = DenseType::F32;
  return DeviceBuffer::from(v);
}

const TensorInfo& dense_matrix(const Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = ck.get(name);
  DSV_CHECK(t.shape == std::vector<int64_t>({rows, cols}), "tensor {} has shape {}, expected [{}, {}]", name,
            t.shape_str(), rows, cols);
  DSV_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32,
            "tensor {}: dtype {} where BF16/F16/F32 is expected", name, dtype_name(t.dtype));
  return t;
}

}  // namespace

void load_dspark(Impl& m) {
  const ModelConfig& c = m.cfg;
  if (c.num_nextn_predict_layers <= 0 || c.dspark_block_size <= 0) return;
  const Checkpoint& ck = *m.ckpt;
  const int64_t S = c.num_nextn_predict_layers, dim = c.hidden_size, V = c.vocab_size, rank = c.dspark_markov_rank;
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  DSV_CHECK(nt > 0, "config: DSpark needs dspark_target_layer_ids");
  for (int64_t t : c.dspark_target_layer_ids)
    DSV_CHECK(t >= 0 && t < c.num_hidden_layers, "config: DSpark target layer {} out of range", t);
  DSV_CHECK(rank >= 1, "config: dspark_markov_rank must be positive, got {}", rank);
  DSV_CHECK(c.dspark_noise_token_id >= 0 && c.dspark_noise_token_id < V, "config: dspark_noise_token_id out of range");
  DSV_CHECK(c.dspark_block_size <= std::min(m.opts.max_chunk_tokens, m.opts.max_logit_rows),
            "CUDA model: a DSpark block of {} rows does not fit a pass of {} tokens (max_chunk_tokens) with {} "
            "logit rows (max_logit_rows)",
            c.dspark_block_size, m.opts.max_chunk_tokens, m.opts.max_logit_rows);

  auto d = std::make_shared<DsparkModel>();
  d->n_taps = nt;
  d->block = c.dspark_block_size;
  d->rank = rank;
  d->stages.resize(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    GpuBlock& b = d->stages[static_cast<size_t>(s)];
    m.load_block(b, c.num_hidden_layers + s, "mtp." + std::to_string(s), true);
    DSV_CHECK(b.ratio == 0, "config: DSpark stage {} has compress ratio {} (must be 0)", s, b.ratio);
  }
  const int kAuto = static_cast<int>(LinearKind::kAuto);
  d->main_proj = m.upload_linear("mtp.0.main_proj", nt * dim, dim, kAuto);
  auto f32 = [&](const std::string& name, int64_t n) {
    DeviceBuffer b = DeviceBuffer::from(load_f32(ck, name, {n}));
    m.weight_bytes += static_cast<int64_t>(b.bytes());
    return b;
  };
  const std::string last = "mtp." + std::to_string(S - 1);
  d->main_norm = f32("mtp.0.main_norm.weight", dim);
  d->norm = f32(last + ".norm.weight", dim);

  const std::string me = last + ".markov_head.embed", mh = last + ".markov_head.head", ch = last + ".confidence_head.proj";
  DSV_CHECK(!exl3::is_exl3_linear(ck, mh) && !exl3::is_exl3_linear(ck, ch),
            "{}: EXL3-quantized DSpark heads are not supported by the CUDA model backend yet; use --device cpu", last);
  d->markov_embed_host = &dense_matrix(ck, me + ".weight", V, rank);
  d->markov_embed = upload_values(tensor_to_f32(*d->markov_embed_host), d->markov_embed_type);
  {
    const std::vector<float> w = tensor_to_f32(dense_matrix(ck, mh + ".weight", V, rank));
    std::vector<float> wt(w.size());
    for (int64_t v = 0; v < V; ++v)
      for (int64_t k = 0; k < rank; ++k) wt[static_cast<size_t>(k * V + v)] = w[static_cast<size_t>(v * rank + k)];
    d->markov_head_t = upload_values(wt, d->markov_head_type);
  }
  m.weight_bytes += static_cast<int64_t>(d->markov_embed.bytes() + d->markov_head_t.bytes());
  d->confidence = load_f32(ck, ch + ".weight", {1, dim + rank});

  // Scratch for passes of up to max_chunk_tokens rows.
  const int64_t rows = m.opts.max_chunk_tokens, hd = c.head_dim, win = c.sliding_window, B = d->block;
  d->taps = DeviceBuffer(static_cast<size_t>(rows * nt * dim) * 4);
  d->main_x = DeviceBuffer(static_cast<size_t>(rows * dim) * 4);
  d->ring_kv = DeviceBuffer(static_cast<size_t>(rows * hd) * 4);
  d->hpre = DeviceBuffer(static_cast<size_t>(rows * dim) * 4);
  d->ids = DeviceBuffer(static_cast<size_t>((B + 1) * rows) * 4);
  d->positions = DeviceBuffer(static_cast<size_t>(rows) * 8);
  d->lists = DeviceBuffer(static_cast<size_t>(rows * (win + B)) * 4);
  m.dspark = std::move(d);
  m.dspark_stages = S;
}

void dspark_capture_tap(Impl& m, int64_t layer, int64_t n) {
  const ModelConfig& c = m.cfg;
  DsparkModel& d = *m.dspark;
  for (int64_t ti = 0; ti < d.n_taps; ++ti) {
    if (c.dspark_target_layer_ids[static_cast<size_t>(ti)] != layer) continue;
    gpu::StreamMeanArgs a{m.sc.h, n, c.hc_mult, c.hidden_size, d.taps.as<float>() + ti * c.hidden_size,
                          d.n_taps * c.hidden_size};
    gpu::stream_mean(a, m.stream);
  }
}

namespace {

// The DSpark ring rows of `rows` captured tap rows from tap row t0, at positions pos0 + r (or
// positions[r], a device array, when set): main_proj, main_norm, then per stage wkv, kv_norm,
// RoPE, QDQ8 into d.ring_kv; store(stage, kv) writes the stage's rows into the rings.
template <class Store>
void ring_rows(Impl& m, int64_t t0, int64_t rows, int64_t pos0, const int64_t* positions, Store&& store) {
  const ModelConfig& c = m.cfg;
  DsparkModel& d = *m.dspark;
  const int64_t dim = c.hidden_size, hd = c.head_dim, rd = c.qk_rope_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* mx = d.main_x.as<float>();
  float* kv = d.ring_kv.as<float>();
  m.linear(d.main_proj, d.taps.as<float>() + t0 * d.n_taps * dim, d.n_taps * dim, rows, mx, dim, true);
  // main_norm writes the codes of mx once for every stage's wkv (sc.x_codes: no block runs now).
  bool want_codes = false;
  for (const GpuBlock& b : d.stages) want_codes = want_codes || Impl::takes_codes(b.wkv);
  gpu::RmsNormArgs mn{mx, dim, d.main_norm.as<float>(), mx, dim, rows, dim, eps};
  const QuantizedInput mxq = m.rms_norm_rows(mn, want_codes, m.sc.x_codes, m.sc.x_scales);
  for (size_t s = 0; s < d.stages.size(); ++s) {
    const GpuBlock& b = d.stages[s];
    m.linear(b.wkv, mx, dim, rows, kv, hd, true, mxq);
    gpu::RmsNormArgs kn{kv, hd, b.kv_norm.as<float>(), kv, hd, rows, hd, eps};
    gpu::rms_norm(kn, m.stream);
    gpu::RopeArgs r;
    r.v = kv + hd - rd;
    r.rows = rows;
    r.vecs = 1;
    r.vec_stride = hd;
    r.row_stride = hd;
    r.freqs = b.freqs.as<float>();
    r.rope_dim = rd;
    r.pos0 = pos0;
    r.positions = positions;
    gpu::rope(r, m.stream);
    gpu::QdqArgs q8{kv, rows, hd, hd, gpu::QdqKind::Q8};
    gpu::qdq(q8, m.stream);
    store(s, kv);
  }
}

}  // namespace

void dspark_feed_rings(Impl& m, CudaSeqState& st, const Pass& p) {
  const ModelConfig& c = m.cfg;
  DsparkModel& d = *m.dspark;
  const int64_t hd = c.head_dim, win = c.sliding_window;
  DSV_ASSERT(st.dspark.ring.size() == d.stages.size(), "sequence state without DSpark rings");
  // Only the last `win` positions survive in the rings.
  const int64_t t0 = std::max<int64_t>(0, p.n - win), rows = p.n - t0;
  ring_rows(m, t0, rows, p.start + t0, nullptr, [&](size_t s, const float* kv) {
    uint16_t* ring = st.dspark.ring[s].as<uint16_t>();
    const int64_t s0 = (p.start + t0) % win, first = std::min(rows, win - s0);
    gpu::StoreBf16Args a{kv, first, hd, hd, ring + s0 * hd, hd};
    gpu::store_bf16(a, m.stream);
    if (rows > first) {
      gpu::StoreBf16Args w{kv + first * hd, rows - first, hd, hd, ring, hd};
      gpu::store_bf16(w, m.stream);
    }
  });
}

void dspark_feed_rings_batch(Impl& m, const DecodeBatch& db) {
  const ModelConfig& c = m.cfg;
  DsparkModel& d = *m.dspark;
  const int64_t hd = c.head_dim, win = c.sliding_window, n = db.rows();
  for (const CudaSeqState* st : db.seqs)
    DSV_ASSERT(st->dspark.ring.size() == d.stages.size(), "sequence state without DSpark rings");
  // Row i: one position of its own sequence, into that sequence's ring slot.
  ring_rows(m, 0, n, 0, m.sc.positions, [&](size_t s, const float* kv) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t* ring = db.seqs[static_cast<size_t>(i)]->dspark.ring[s].as<uint16_t>();
      gpu::StoreBf16Args a{kv + i * hd, 1, hd, hd, ring + (db.pos[static_cast<size_t>(i)] % win) * hd, hd};
      gpu::store_bf16(a, m.stream);
    }
  });
}

namespace {

// One DSpark stage over the block rows of `ns` sequences (block.cpp block_forward with a
// DsparkContext): rows [s*B, (s+1)*B) belong to sequence s.
void stage_forward(Impl& m, size_t stage, std::span<CudaSeqState* const> seqs, const std::vector<int64_t>& list_off,
                   const std::vector<int64_t>& list_len) {
  const ModelConfig& c = m.cfg;
  DsparkModel& d = *m.dspark;
  const GpuBlock& b = d.stages[stage];
  Scratch& sc = m.sc;
  const int64_t B = d.block, ns = static_cast<int64_t>(seqs.size()), n = ns * B;
  m.row_invariant_pass = true;  // drafts take the row-invariant kernels, as decode steps do
  const int64_t hc = c.hc_mult, dim = c.hidden_size, mixw = (2 + hc) * hc, H = c.num_attention_heads;
  const int64_t hd = c.head_dim, rd = c.qk_rope_head_dim, win = c.sliding_window;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto mix = [&](const DeviceBuffer& fn, const DeviceBuffer& base, const DeviceBuffer& scale, float* out) {
    for (int64_t s = 0; s < ns; ++s) {  // each sequence's rows are one reference call of B rows
      gpu::HcMixArgs a = gpu::hc_mix_args(c, sc.h + s * B * hc * dim, B,
                                          fn.as<float>(), base.as<float>(), scale.as<float>(), out + s * B * mixw);
      a.t_ref0 = 0;
      a.rows_ref = B;
      a.k_parts = 0;
      gpu::hc_mix(a, m.stream);
    }
  };
  // The normed rows sc.x, with their codes (sc.x_codes) when an FP8/FP4 linear reads them.
  auto collapse_norm = [&](const float* w, int64_t w_stride, const DeviceBuffer& norm, bool want_codes) {
    const gpu::HcCollapseArgs a{sc.h, w, w_stride, n, hc, dim, sc.x};
    const gpu::RmsNormArgs r{sc.x, dim, norm.as<float>(), sc.x, dim, n, dim, eps};
    return m.collapse_norm_rows(a, r, want_codes, sc.x_codes, sc.x_scales);
  };
  gpu::RopeArgs at;
  at.positions = d.positions.as<int64_t>();
  auto rope = [&](float* v, int64_t vecs, int64_t vec_stride, int64_t row_stride, bool inverse) {
    m.rope_rows(b, at, v, n, vecs, vec_stride, row_stride, inverse);
  };

  mix(b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, sc.mix_a);
  const bool attn_codes = Impl::takes_codes(b.wq_a) || Impl::takes_codes(b.wkv);
  const QuantizedInput xq = collapse_norm(sc.pre, hc, b.attn_norm, attn_codes);

  // ---- attention (block.cpp dspark_attention) ----
  m.project_q_kv(b, n, at, xq);  // a DSpark stage is loaded whole: b.n_heads == H
  gpu::StoreBf16Args kb{sc.kv, n, hd, hd, sc.kv_bf16, hd};
  gpu::store_bf16(kb, m.stream);
  for (int64_t s = 0; s < ns; ++s) {
    // pool a: this sequence's ring of the stage (entries < win); pool b: its block rows.
    gpu::FillPointersArgs fa{sc.pool_a + s * B, B, seqs[static_cast<size_t>(s)]->dspark.ring[stage].as<uint16_t>()};
    gpu::fill_pointers(fa, m.stream);
    gpu::FillPointersArgs fb{sc.pool_b + s * B, B, sc.kv_bf16 + s * B * hd};
    gpu::fill_pointers(fb, m.stream);
    gpu::SparseAttnArgs sa;
    sa.q = sc.q + s * B * H * hd;
    sa.list = d.lists.as<int32_t>() + list_off[static_cast<size_t>(s)];
    sa.list_len = list_len[static_cast<size_t>(s)];
    sa.pool_a = sc.pool_a + s * B;
    sa.pool_b = sc.pool_b + s * B;
    sa.split = win;
    sa.sink = b.sink.as<float>();
    sa.scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
    sa.n_q = B;
    sa.heads = H;
    sa.d = hd;
    sa.out = sc.o + s * B * H * hd;
    if (B == 1) gpu::sparse_attention_decode(sa, m.stream);
    else gpu::sparse_attention_prefill(sa, m.stream);
  }
  rope(sc.o + hd - rd, H, hd, H * hd, true);
  m.attn_output(b, n);

  gpu::HcExpandArgs ea{sc.y, sc.h, sc.mix_a, n, hc, dim};
  gpu::hc_expand(ea, m.stream);
  mix(b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, sc.mix_f);
  // exact kernels: a draft must not depend on how many sequences draft together; EXL3 experts (the
  // shared one too) read the floats, FP4 banks always read codes
  m.moe(b, n, true, collapse_norm(sc.mix_a, mixw, b.ffn_norm, !b.x_experts.loaded()));
  gpu::HcExpandArgs ef{sc.y, sc.h, sc.mix_f, n, hc, dim};
  gpu::hc_expand(ef, m.stream);
  gpu::check_cuda(cudaMemcpy2DAsync(sc.pre, static_cast<size_t>(hc) * 4, sc.mix_f, static_cast<size_t>(mixw) * 4,
                                    static_cast<size_t>(hc) * 4, static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                                    m.stream),
                  "dspark pre copy");
}

// The draft blocks of ns sequences in one pass (ns * block <= the scratch's rows).
void draft_group(Impl& m, std::span<CudaSeqState* const> seqs, std::span<const int32_t> anchors, DsparkDraft* out) {
  const ModelConfig& c = m.cfg;
  DsparkModel& d = *m.dspark;
  Scratch& sc = m.sc;
  const int64_t B = d.block, ns = static_cast<int64_t>(seqs.size()), n = ns * B;
  const int64_t hc = c.hc_mult, dim = c.hidden_size, V = c.vocab_size, win = c.sliding_window, rank = d.rank;

  // ---- block rows [anchor, noise ..] at positions n_past .., one-hot pre; attention lists ----
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::vector<float> pre(static_cast<size_t>(n * hc), 0.0f);
  d.positions_host.assign(static_cast<size_t>(n), 0);
  d.lists_host.clear();
  std::vector<int64_t> list_off(static_cast<size_t>(ns)), list_len(static_cast<size_t>(ns));
  for (int64_t s = 0; s < ns; ++s) {
    const CudaSeqState& st = *seqs[static_cast<size_t>(s)];
    // Ring slots 0 .. min(win, P+1)-1 in slot order (P = n_past - 1), then every block row.
    const int64_t nr = std::min(win, st.n_past);
    list_off[static_cast<size_t>(s)] = static_cast<int64_t>(d.lists_host.size());
    list_len[static_cast<size_t>(s)] = nr + B;
    for (int64_t j = 0; j < B; ++j) {
      const int64_t r = s * B + j;
      tokens[static_cast<size_t>(r)] = j == 0 ? anchors[static_cast<size_t>(s)] : static_cast<int32_t>(c.dspark_noise_token_id);
      pre[static_cast<size_t>(r * hc)] = 1.0f;
      d.positions_host[static_cast<size_t>(r)] = st.n_past + j;
      for (int64_t e = 0; e < nr; ++e) d.lists_host.push_back(static_cast<int32_t>(e));
      for (int64_t e = 0; e < B; ++e) d.lists_host.push_back(static_cast<int32_t>(win + e));
    }
  }
  // Host sources are pageable: each call returns once its source is staged.
  auto upload = [&](void* dst, const void* src, size_t bytes, const char* what) {
    gpu::check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, m.stream), what);
  };
  upload(sc.tokens, tokens.data(), tokens.size() * 4, "dspark tokens upload");
  upload(sc.pre, pre.data(), pre.size() * 4, "dspark pre upload");
  upload(d.positions.get(), d.positions_host.data(), d.positions_host.size() * 8, "dspark positions upload");
  upload(d.lists.get(), d.lists_host.data(), d.lists_host.size() * 4, "dspark lists upload");
  upload(d.ids.get(), anchors.data(), static_cast<size_t>(ns) * 4, "dspark anchors upload");
  gpu::EmbedArgs ea{m.embed.as<uint16_t>(), V, dim, hc, sc.tokens, n, sc.h};
  gpu::embed(ea, m.stream);

  for (size_t s = 0; s < d.stages.size(); ++s) stage_forward(m, s, seqs, list_off, list_len);

  // ---- hpre = Collapse(h, pre); base logits of RMSNorm(norm, hpre), laid out [row j][sequence] ----
  float* hpre = d.hpre.as<float>();
  gpu::HcCollapseArgs ca{sc.h, sc.pre, hc, n, hc, dim, hpre};
  gpu::hc_collapse(ca, m.stream);
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t j = 0; j < B; ++j) {
    gpu::RmsNormArgs r{hpre + j * dim, B * dim, d.norm.as<float>(), sc.x + j * ns * dim, dim, ns, dim, eps};
    gpu::rms_norm(r, m.stream);
  }
  m.head_logits(sc.x, n, sc.logits);

  // ---- row j: + Markov bias of ids[j], then ids[j+1] = argmax (ids laid out [j][sequence]) ----
  int32_t* ids = d.ids.as<int32_t>();
  for (int64_t j = 0; j < B; ++j) {
    gpu::MarkovBiasArgs mb;
    mb.logits = sc.logits + j * ns * V;
    mb.rows = ns;
    mb.vocab = V;
    mb.rank = rank;
    mb.logits_stride = V;
    mb.head_t = d.markov_head_t.get();
    mb.head_type = d.markov_head_type;
    mb.embed = d.markov_embed.get();
    mb.embed_type = d.markov_embed_type;
    mb.ids = ids + j * ns;
    gpu::markov_bias(mb, m.stream);
    gpu::ArgmaxArgs am{sc.logits + j * ns * V, ns, V, ids + (j + 1) * ns};
    gpu::argmax(am, m.stream);
  }
  d.ids_host.resize(static_cast<size_t>((B + 1) * ns));
  d.logits_host.resize(static_cast<size_t>(n * V));
  d.hpre_host.resize(static_cast<size_t>(n * dim));
  auto download = [&](void* dst, const void* src, size_t bytes, const char* what) {
    gpu::check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, m.stream), what);
  };
  download(d.ids_host.data(), ids, d.ids_host.size() * 4, "dspark ids download");
  download(d.logits_host.data(), sc.logits, d.logits_host.size() * 4, "dspark logits download");
  download(d.hpre_host.data(), hpre, d.hpre_host.size() * 4, "dspark hpre download");
  gpu::check_cuda(cudaStreamSynchronize(m.stream), "dspark draft");

  // ---- outputs; confidence logits in the CPU engine's order ----
  std::vector<float> e(static_cast<size_t>(rank));
  for (int64_t s = 0; s < ns; ++s) {
    DsparkDraft& o = out[s];
    o.ids.resize(static_cast<size_t>(B + 1));
    for (int64_t i = 0; i <= B; ++i) o.ids[static_cast<size_t>(i)] = d.ids_host[static_cast<size_t>(i * ns + s)];
    o.logits.resize(static_cast<size_t>(B * V));
    o.confidence.resize(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      std::copy_n(&d.logits_host[static_cast<size_t>((i * ns + s) * V)], V, &o.logits[static_cast<size_t>(i * V)]);
      const int32_t id = o.ids[static_cast<size_t>(i)];
      DSV_CHECK(id >= 0 && id < V, "DSpark draft: token {} outside the vocabulary (non-finite drafter logits?)", id);
      tensor_row_f32(*d.markov_embed_host, id, e.data());
      const float* hp = &d.hpre_host[static_cast<size_t>((s * B + i) * dim)];
      float conf = 0.0f;
      for (int64_t k = 0; k < dim; ++k) conf += d.confidence[static_cast<size_t>(k)] * hp[k];
      for (int64_t k = 0; k < rank; ++k) conf += d.confidence[static_cast<size_t>(dim + k)] * e[static_cast<size_t>(k)];
      o.confidence[static_cast<size_t>(i)] = conf;
    }
  }
}

}  // namespace

std::vector<DsparkDraft> dspark_draft(Impl& m, std::span<CudaSeqState* const> states, std::span<const int32_t> anchors) {
  const ModelConfig& c = m.cfg;
  DSV_CHECK(m.dspark != nullptr, "this model was loaded without DSpark stages");
  DSV_CHECK(states.size() == anchors.size(), "DSpark draft: {} states for {} anchors", states.size(), anchors.size());
  for (size_t i = 0; i < states.size(); ++i) {
    DSV_CHECK(states[i]->n_past > 0, "DSpark needs at least one processed position");
    DSV_CHECK(anchors[i] >= 0 && anchors[i] < c.vocab_size, "DSpark anchor token {} outside the vocabulary", anchors[i]);
  }
  std::vector<DsparkDraft> out(states.size());
  // a group's rows all get logits from one head launch into sc.logits
  const auto group = static_cast<size_t>(std::max<int64_t>(1, m.sc.logit_rows / m.dspark->block));
  for (size_t g0 = 0; g0 < states.size(); g0 += group) {
    const size_t cnt = std::min(group, states.size() - g0);
    draft_group(m, states.subspan(g0, cnt), anchors.subspan(g0, cnt), out.data() + g0);
  }
  return out;
}

}  // namespace dsv41::model::cuda
#endif
