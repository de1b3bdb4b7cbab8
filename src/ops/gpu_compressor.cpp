// The compressor of a KV-source layer on the GPU (MODEL.md §5.4), composed from the op kernels in
// the CPU reference's order: ratio 1 = RMSNorm(LinBF16(wkv, x)) per token; ratio r > 1 = fp32
// LinF32 kv/score, carried state, softmax pooling, RMSNorm. Each emitted group j (rope position
// j·r) appends QDQ4b(RoPE(latent)) to the compressed cache and, where the layer owns index keys,
// QDQ4a(RoPE(RMSNorm(LinBF16(wk, latent)))) to the key cache.
#include "dsv41/ops/gpu_ops.h"

#if DSV41_HAS_CUDA
#include <algorithm>

#include "dsv41/common/error.h"
#include "dsv41/ops/gpu_buffer.h"

namespace dsv41::ops::gpu {

void compressor_project(const CompressorWeights& w, const CompressorScratch& sc, const float* x, int64_t n,
                        cudaStream_t s) {
  DSV_CHECK(n >= 0 && n <= sc.max_tokens, "compressor: {} tokens exceed the scratch capacity {}", n, sc.max_tokens);
  DSV_CHECK(w.wkv && (w.ratio == 1 || w.wgate) && sc.latent && (w.ratio == 1 || (sc.a && sc.g)),
            "compressor projection: weights or scratch missing");
  if (n == 0) return;
  DenseArgs lin;
  lin.in = w.dim;
  lin.out = w.hd;
  lin.x = x;
  lin.x_stride = w.dim;
  lin.m = n;
  lin.y_stride = w.hd;
  if (w.ratio == 1) {
    lin.w = w.wkv;
    lin.wt = w.wkv_type;
    lin.y = sc.latent;
    lin.round_bf16 = true;
    lin_dense(lin, s);
  } else {
    lin.round_bf16 = false;
    lin.wt = DenseType::F32;
    lin.w = w.wkv;
    lin.y = sc.a;
    lin_dense(lin, s);
    lin.w = w.wgate;
    lin.y = sc.g;
    lin_dense(lin, s);
  }
}

int64_t compressor_step(const CompressorWeights& w, CompressorState& st, const CompressorScratch& sc, const float* x,
                        int64_t n, int64_t start, cudaStream_t s) {
  DSV_CHECK(w.ratio >= 1 && w.ratio <= 16, "compressor: ratio {} outside 1..16", w.ratio);
  DSV_CHECK(n >= 0 && n <= sc.max_tokens, "compressor: {} tokens exceed the scratch capacity {}", n, sc.max_tokens);
  DSV_CHECK(w.norm && w.freqs && (w.projected || (w.wkv && (w.ratio == 1 || w.wgate))), "compressor: weights missing");
  DSV_CHECK(w.rope_dim <= w.hd && (!w.i_wk || (w.i_k_norm && w.rope_dim <= w.ihd && st.index_keys)),
            "compressor: rope_dim {} / index-key setup inconsistent", w.rope_dim);
  DSV_CHECK(st.compressed && sc.latent && sc.work && (w.ratio == 1 || (sc.a && sc.g && st.carry_kv && st.carry_score)),
            "compressor: state or scratch buffers missing");
  const int64_t first = start / w.ratio, groups = (start + n) / w.ratio - start / w.ratio;
  DSV_CHECK(first == st.n_entries || groups == 0, "compressor: group {} emitted with {} entries stored", first,
            st.n_entries);
  DSV_CHECK(st.n_entries + groups <= st.capacity, "compressor: cache capacity {} exceeded", st.capacity);
  if (n == 0) return 0;
  const int64_t hd = w.hd;

  if (!w.projected) compressor_project(w, sc, x, n, s);
  if (w.ratio > 1) {
    CompressPoolArgs pa;
    pa.av = sc.a;
    pa.gv = sc.g;
    pa.carry_kv = st.carry_kv;
    pa.carry_score = st.carry_score;
    pa.n = n;
    pa.start = start;
    pa.ratio = w.ratio;
    pa.hd = hd;
    pa.pooled = sc.latent;
    compress_pool(pa, s);
  }
  if (groups == 0) return 0;
  RmsNormArgs rn;
  rn.x = sc.latent;
  rn.x_stride = hd;
  rn.w = w.norm;
  rn.out = sc.latent;
  rn.out_stride = hd;
  rn.rows = groups;
  rn.d = hd;
  rn.eps = w.eps;
  rms_norm(rn, s);

  RopeArgs ro;
  ro.rows = groups;
  ro.freqs = w.freqs;
  ro.rope_dim = w.rope_dim;
  ro.pos0 = first * w.ratio;
  ro.pos_step = w.ratio;
  StoreBf16Args stb;
  stb.rows = groups;
  stb.x = sc.work;

  if (w.i_wk) {
    const int64_t ihd = w.ihd;
    DenseArgs k;
    k.w = w.i_wk;
    k.wt = w.i_wk_type;
    k.in = hd;
    k.out = ihd;
    k.x = sc.latent;
    k.x_stride = hd;
    k.m = groups;
    k.y = sc.work;
    k.y_stride = ihd;
    lin_dense(k, s);
    RmsNormArgs kn = rn;
    kn.x = kn.out = sc.work;
    kn.x_stride = kn.out_stride = ihd;
    kn.w = w.i_k_norm;
    kn.d = ihd;
    rms_norm(kn, s);
    ro.v = sc.work + ihd - w.rope_dim;
    ro.row_stride = ihd;
    rope(ro, s);
    QdqArgs q;
    q.x = sc.work;
    q.rows = groups;
    q.k = ihd;
    q.stride = ihd;
    q.kind = QdqKind::Q4a;
    qdq(q, s);
    stb.cols = stb.x_stride = stb.dst_stride = ihd;
    stb.dst = st.index_keys + st.n_entries * ihd;
    store_bf16(stb, s);
  }
  check_cuda(cudaMemcpyAsync(sc.work, sc.latent, static_cast<size_t>(groups * hd) * sizeof(float),
                             cudaMemcpyDeviceToDevice, s),
             "compressor copy");
  ro.v = sc.work + hd - w.rope_dim;
  ro.row_stride = hd;
  rope(ro, s);
  QdqArgs q;
  q.x = sc.work;
  q.rows = groups;
  q.k = hd;
  q.stride = hd;
  q.kind = QdqKind::Q4b;
  qdq(q, s);
  stb.cols = stb.x_stride = stb.dst_stride = hd;
  stb.dst = st.compressed + st.n_entries * hd;
  store_bf16(stb, s);
  st.n_entries += groups;
  return groups;
}

}  // namespace dsv41::ops::gpu
#endif
