// Loading the CUDA backend: every tensor of the release format read with the CPU engine's loaders
// (same names, shapes and load-time conversions as src/model/cpu_load.cpp) and uploaded once; the
// scratch arena sized from the config. FP8 and FP4 weights stay in their stored codes and scales.
#include "cuda_model/cuda_impl.h"
#include "cuda_model/cuda_dspark.h"
#include "cuda_model/cuda_upload.h"
#include "dsv41/model/cuda_scratch_plan.h"

#if DSV41_HAS_CUDA
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"
#include "dsv41/exl3/exl3_linear.h"
#include "model/cpu_impl.h"
#include "model/linears.h"
#include "model/ops/rope.h"

namespace dsv41::model::cuda {
namespace {

// Load-time conversions run over the thread pool (element-wise: the split cannot change a value).
constexpr int64_t kConvertChunk = int64_t{1} << 16;

// True when every value survives the round trip through a 16-bit format (NaNs stay NaNs).
template <class Round>
bool exact_in(const std::vector<float>& v, Round round) {
  std::atomic<bool> exact{true};
  parallel_for(static_cast<int64_t>(v.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e && exact.load(std::memory_order_relaxed); ++i) {
      const float f = v[static_cast<size_t>(i)];
      if (!std::isnan(f) && round(f) != f) exact.store(false, std::memory_order_relaxed);
    }
  }, kConvertChunk);
  return exact.load();
}
bool bf16_exact(const std::vector<float>& v) { return exact_in(v, [](float f) { return bf16_round(f); }); }
bool f16_exact(const std::vector<float>& v) { return exact_in(v, [](float f) { return f16_round(f); }); }

template <class Bits>
std::vector<uint16_t> to_bits(const std::vector<float>& v, Bits bits) {
  std::vector<uint16_t> b(v.size());
  parallel_for(static_cast<int64_t>(v.size()), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) b[static_cast<size_t>(i)] = bits(v[static_cast<size_t>(i)]);
  }, kConvertChunk);
  return b;
}
std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  return to_bits(v, [](float f) { return f32_to_bf16_bits(f); });
}

// Weight uploads of load(): through the pinned staging when it is set, else synchronous.
void upload_bytes(StagedUploader* staging, DeviceBuffer& d, const void* src, size_t bytes, size_t offset = 0) {
  if (staging) staging->upload(d, src, bytes, offset);
  else d.upload(src, bytes, offset);
}

template <class T>
DeviceBuffer upload_vector(StagedUploader* staging, const std::vector<T>& v) {
  return staging ? staging->from(v) : DeviceBuffer::from(v);
}

}  // namespace

Impl::~Impl() {
  graphs.reset();  // executables and any open capture go before their stream
  if (engram_uploaded) cudaEventDestroy(engram_uploaded);
  if (scores_ready) cudaEventDestroy(scores_ready);
  for (cudaEvent_t e : layer_events) cudaEventDestroy(e);
  for (cudaEvent_t e : score_slice_ready)
    if (e) cudaEventDestroy(e);
  if (stream) cudaStreamDestroy(stream);
}

// The narrowest exact storage of a dense weight for gpu::lin_dense: bf16 (the released format's
// dense linears), fp16 (an EXL3 checkpoint's unquantized linears: Engram wkv, weights_proj), else
// fp32; the kernels widen each to fp32 exactly, so only the bytes differ.
static DeviceBuffer upload_dense(StagedUploader* staging, const std::vector<float>& v, DenseType& type,
                                 bool force_f32 = false) {
  if (!force_f32 && bf16_exact(v)) {
    type = DenseType::BF16;
    return upload_vector(staging, to_bf16_bits(v));
  }
  if (!force_f32 && f16_exact(v)) {
    type = DenseType::F16;
    return upload_vector(staging, to_bits(v, [](float f) { return f32_to_f16_bits(f); }));
  }
  type = DenseType::F32;
  return upload_vector(staging, v);
}

GpuLinear Impl::upload_linear(const std::string& prefix, int64_t in, int64_t out, int kind_int) {
  const auto kind = static_cast<LinearKind>(kind_int);
  const Checkpoint& ck = *ckpt;
  // EXL3 whatever the requested kind, as the CPU engine's load_linear (cuda_exl3.cpp).
  if (exl3::is_exl3_linear(ck, prefix)) return upload_exl3(prefix, in, out);
  GpuLinear l;
  l.in = in;
  l.out = out;
  const TensorInfo& w = ck.get(prefix + ".weight");
  if (kind == LinearKind::kAuto && (w.dtype == DType::F8_E4M3 || w.dtype == DType::I8)) {
    // The CPU engine's constructors check shapes; building one validates the tensors identically.
    (void)load_linear(ck, prefix, in, out, kind);
    const TensorInfo& s = ck.get(prefix + ".scale");
    l.kind = w.dtype == DType::F8_E4M3 ? GpuLinear::Kind::Fp8 : GpuLinear::Kind::Fp4;
    l.w = DeviceBuffer(w.nbytes);
    upload_bytes(staging, l.w, w.data, w.nbytes);
    l.s = DeviceBuffer(s.nbytes);
    upload_bytes(staging, l.s, s.data, s.nbytes);
  } else {
    std::vector<float> v = load_dense_weight(ck, prefix, in, out);
    if (kind == LinearKind::kBF16 && w.dtype == DType::F8_E4M3) round_to_bf16(v);
    l.kind = GpuLinear::Kind::Dense;
    l.w = upload_dense(staging, v, l.dense_type, kind == LinearKind::kF32);
  }
  weight_bytes += static_cast<int64_t>(l.w.bytes() + l.s.bytes());
  count_weight_bytes(l);
  return l;
}

GpuLinear Impl::upload_linear_rows(const std::string& prefix, int64_t in, int64_t out, int64_t row_begin,
                                   int64_t row_end, int kind_int) {
  if (row_begin == 0 && row_end == out) return upload_linear(prefix, in, out, kind_int);
  const auto kind = static_cast<LinearKind>(kind_int);
  const Checkpoint& ck = *ckpt;
  if (exl3::is_exl3_linear(ck, prefix)) return upload_exl3(prefix, in, out, row_begin, row_end);
  DSV_CHECK(row_begin >= 0 && row_begin < row_end && row_end <= out, "{}: row slice [{}, {}) of {} rows", prefix,
            row_begin, row_end, out);
  const int64_t rows = row_end - row_begin;
  GpuLinear l;
  l.in = in;
  l.out = rows;
  const TensorInfo& w = ck.get(prefix + ".weight");
  if (kind == LinearKind::kAuto && (w.dtype == DType::F8_E4M3 || w.dtype == DType::I8)) {
    (void)load_linear(ck, prefix, in, out, kind);  // the CPU engine's shape checks
    const TensorInfo& s = ck.get(prefix + ".scale");
    size_t w_off, w_bytes, s_off, s_bytes;
    if (w.dtype == DType::F8_E4M3) {  // codes [out][in], scales [ceil(out/32)][ceil(in/32)]
      DSV_CHECK(row_begin % 32 == 0, "{}: an FP8 row slice must start at a multiple of 32 (got {})", prefix, row_begin);
      const int64_t nb = (in + 31) / 32;
      w_off = static_cast<size_t>(row_begin * in);
      w_bytes = static_cast<size_t>(rows * in);
      s_off = static_cast<size_t>(row_begin / 32 * nb);
      s_bytes = static_cast<size_t>((rows + 31) / 32 * nb);
      l.kind = GpuLinear::Kind::Fp8;
    } else {  // FP4: packed [out][in/2], scales [out][in/32]
      w_off = static_cast<size_t>(row_begin * (in / 2));
      w_bytes = static_cast<size_t>(rows * (in / 2));
      s_off = static_cast<size_t>(row_begin * (in / 32));
      s_bytes = static_cast<size_t>(rows * (in / 32));
      l.kind = GpuLinear::Kind::Fp4;
    }
    l.w = DeviceBuffer(w_bytes);
    upload_bytes(staging, l.w, w.data + w_off, w_bytes);
    l.s = DeviceBuffer(s_bytes);
    upload_bytes(staging, l.s, s.data + s_off, s_bytes);
  } else {
    std::vector<float> v = load_dense_weight(ck, prefix, in, out);
    if (kind == LinearKind::kBF16 && w.dtype == DType::F8_E4M3) round_to_bf16(v);
    const std::vector<float> part(v.begin() + row_begin * in, v.begin() + row_end * in);
    l.kind = GpuLinear::Kind::Dense;
    l.w = upload_dense(staging, part, l.dense_type, kind == LinearKind::kF32);
  }
  weight_bytes += static_cast<int64_t>(l.w.bytes() + l.s.bytes());
  count_weight_bytes(l);
  return l;
}

void Impl::load_block(GpuBlock& b, int64_t layer, const std::string& prefix_arg, bool is_dspark) {
  const ModelConfig& c = cfg;
  const Checkpoint& ck = *ckpt;
  const int64_t dim = c.hidden_size, hd = c.head_dim, H = c.num_attention_heads, hc = c.hc_mult;
  const std::string prefix = prefix_arg.empty() ? "layers." + std::to_string(layer) : prefix_arg;
  auto f32 = [&](const std::string& name, std::vector<int64_t> shape) {
    DeviceBuffer d = upload_vector(staging, load_f32(ck, name, std::move(shape)));
    weight_bytes += static_cast<int64_t>(d.bytes());
    return d;
  };
  b.layer = layer;
  b.ratio = c.ratio(layer);
  const RopeTable rope = RopeTable::for_ratio(c, b.ratio);
  b.freqs = DeviceBuffer::from(rope.freqs());
  b.attn_norm = f32(prefix + ".attn_norm.weight", {dim});
  b.ffn_norm = f32(prefix + ".ffn_norm.weight", {dim});
  const int64_t mix = (2 + hc) * hc;
  b.hc_attn_fn = f32(prefix + ".hc_attn_fn", {mix, hc * dim});
  b.hc_attn_base = f32(prefix + ".hc_attn_base", {mix});
  b.hc_attn_scale = f32(prefix + ".hc_attn_scale", {3});
  b.hc_ffn_fn = f32(prefix + ".hc_ffn_fn", {mix, hc * dim});
  b.hc_ffn_base = f32(prefix + ".hc_ffn_base", {mix});
  b.hc_ffn_scale = f32(prefix + ".hc_ffn_scale", {3});

  const std::string ap = prefix + ".attn";
  // Tensor parallelism (cuda_tp.cpp): whole output groups and their heads, column slices of wo_b
  // and the shared expert, an expert-id range. DSpark stages stay whole (refused in TP for now).
  const bool split = tp_world > 1 && !is_dspark;
  b.split = split;
  {
    const int64_t G = c.o_groups;
    DSV_CHECK(!split || (G > 0 && H % G == 0),
              "tensor parallel: num_attention_heads ({}) must be a multiple of o_groups ({}) to split whole groups", H,
              G);
    const dist::Range gr = split ? tp_share(G, 1, "attention output groups") : dist::Range{0, G};
    b.group_begin = gr.begin;
    b.n_groups = gr.size();
    b.head_begin = split ? gr.begin * (H / G) : 0;
    b.n_heads = split ? gr.size() * (H / G) : H;
  }
  // Output splits start at multiples of 32 (FP8 scale blocks), or of 128 in an EXL3 checkpoint
  // (whole Hadamard blocks, upload_exl3).
  const int64_t align = c.quant.method == "exl3" ? 128 : 32;
  const dist::Range dim_rows = split ? tp_share(dim, align, "hidden columns") : dist::Range{0, dim};
  const int kAuto = static_cast<int>(LinearKind::kAuto), kBF16 = static_cast<int>(LinearKind::kBF16),
            kF32 = static_cast<int>(LinearKind::kF32);
  b.wq_a = upload_linear(ap + ".wq_a", dim, c.q_lora_rank, kAuto);
  b.wq_b = upload_linear_rows(ap + ".wq_b", c.q_lora_rank, H * hd, b.head_begin * hd,
                              (b.head_begin + b.n_heads) * hd, kAuto);
  b.wkv = upload_linear(ap + ".wkv", dim, hd, kAuto);
  b.wo_b = upload_linear_rows(ap + ".wo_b", c.o_groups * c.o_lora_rank, dim, dim_rows.begin, dim_rows.end, kAuto);
  b.wo_b_begin = dim_rows.begin;
  b.q_norm = f32(ap + ".q_norm.weight", {c.q_lora_rank});
  b.kv_norm = f32(ap + ".kv_norm.weight", {hd});
  {
    const std::vector<float> sink = load_f32(ck, ap + ".attn_sink", {H});
    b.sink = upload_vector(staging, std::vector<float>(sink.begin() + b.head_begin,
                                                       sink.begin() + b.head_begin + b.n_heads));
    weight_bytes += static_cast<int64_t>(b.sink.bytes());
  }
  const int64_t in_g = H * hd / c.o_groups;
  if (ck.has(ap + ".wo_a.slice.0.trellis") || ck.has(ap + ".wo_a.slice.0.weight")) {
    // EXL3 layout (EXL3.md §1.8): one linear per group, each EXL3 or left unquantized (cpu_load.cpp).
    for (int64_t g = b.group_begin; g < b.group_begin + b.n_groups; ++g)
      b.wo_a_slices.push_back(upload_linear(ap + ".wo_a.slice." + std::to_string(g), in_g, c.o_lora_rank, kBF16));
    plan_wo_a_batch(b);
  } else {
    std::vector<float> w = load_dense_weight(ck, ap + ".wo_a", in_g, c.o_groups * c.o_lora_rank);
    if (ck.get(ap + ".wo_a.weight").dtype == DType::F8_E4M3) round_to_bf16(w);
    if (split)  // this rank's groups: rows [g0·R, g1·R)
      w = std::vector<float>(w.begin() + b.group_begin * c.o_lora_rank * in_g,
                             w.begin() + (b.group_begin + b.n_groups) * c.o_lora_rank * in_g);
    b.wo_a = upload_dense(staging, w, b.wo_a_type);
    weight_bytes += static_cast<int64_t>(b.wo_a.bytes());
  }
  if (!is_dspark && c.is_kv_source(layer)) {
    b.has_compressor = true;
    // Ratio 1: LinBF16; ratio > 1: LinF32 (the compressor step takes F32 weights there).
    GpuLinear wkv = upload_linear(ap + ".compressor.wkv", dim, hd, b.ratio > 1 ? kF32 : kBF16);
    GpuLinear wgate = b.ratio > 1 ? upload_linear(ap + ".compressor.wgate", dim, hd, kF32) : GpuLinear{};
    if (wkv.kind == GpuLinear::Kind::Exl3 || wgate.kind == GpuLinear::Kind::Exl3) {
      b.c_wkv_lin = std::move(wkv);
      b.c_wgate_lin = std::move(wgate);
    } else {
      b.c_wkv = std::move(wkv.w);
      b.c_wkv_type = wkv.dense_type;
      b.c_wgate = std::move(wgate.w);
    }
    b.c_norm = f32(ap + ".compressor.norm.weight", {hd});
    if (c.is_index_source(layer)) {
      b.has_index_keys = true;
      GpuLinear wk = upload_linear(ap + ".indexer.wk", hd, c.index_head_dim, kBF16);
      DSV_CHECK(wk.kind == GpuLinear::Kind::Dense,
                "{}.indexer.wk: the CUDA compressor runs index-key weights as a dense matrix (BF16/F16/F32), not EXL3", ap);
      b.i_wk = std::move(wk.w);
      b.i_wk_type = wk.dense_type;
      b.i_k_norm = f32(ap + ".indexer.k_norm.weight", {c.index_head_dim});
    }
  }
  if (!is_dspark && c.is_index_source(layer)) {
    b.has_indexer = true;
    b.i_wq_b = upload_linear(ap + ".indexer.wq_b", c.q_lora_rank, c.index_n_heads * c.index_head_dim, kAuto);
    b.i_weights_proj = upload_linear(ap + ".indexer.weights_proj", dim, c.index_n_heads, kBF16);
  }

  // ---- MoE: routed experts as FP4 banks, the shared expert as plain linears ----
  const std::string fp = prefix + ".ffn";
  b.n_experts = is_dspark ? c.dspark_experts() : c.n_routed_experts;
  b.top_k = is_dspark ? c.dspark_topk() : c.num_experts_per_tok;
  b.gate_w = f32(fp + ".gate.weight", {b.n_experts, dim});
  b.gate_bias = f32(fp + ".gate.bias", {b.n_experts});
  const int64_t inter = c.moe_intermediate_size;
  const dist::Range experts = split ? tp_share(b.n_experts, 1, "routed experts") : dist::Range{0, b.n_experts};
  b.expert_begin = experts.begin;
  auto bank = [&](GpuExpertBank& k, const char* which, int64_t in, int64_t out) {
    k.in = in;
    k.out = out;
    k.n = experts.size();
    const int64_t wbytes = out * (in / 2), sbytes = out * (in / 32);
    k.packed = DeviceBuffer(static_cast<size_t>(k.n * wbytes));
    k.scales = DeviceBuffer(static_cast<size_t>(k.n * sbytes));
    for (int64_t e = experts.begin; e < experts.end; ++e) {
      const std::string p = fp + ".experts." + std::to_string(e) + "." + which;
      DSV_CHECK(!exl3::is_exl3_linear(ck, p),
                "{}: expert 0 of this layer is not EXL3, so no routed expert may be (the CUDA MoE runs one format per "
                "layer)",
                p);
      const TensorInfo& w = ck.get(p + ".weight");
      DSV_CHECK(w.dtype == DType::I8,
                "{}.weight: the CUDA model backend runs routed experts as FP4 (I8) banks, this checkpoint stores {}", p,
                dtype_name(w.dtype));
      (void)load_linear(ck, p, in, out);  // shape checks of the CPU engine
      const TensorInfo& s = ck.get(p + ".scale");
      const int64_t slot = e - experts.begin;
      upload_bytes(staging, k.packed, w.data, static_cast<size_t>(wbytes), static_cast<size_t>(slot * wbytes));
      upload_bytes(staging, k.scales, s.data, static_cast<size_t>(sbytes), static_cast<size_t>(slot * sbytes));
    }
    weight_bytes += static_cast<int64_t>(k.packed.bytes() + k.scales.bytes());
    weight_bytes_fp4 += static_cast<int64_t>(k.packed.bytes() + k.scales.bytes());
  };
  // EXL3 routed experts run through the grouped MoE kernels (with the shared expert, or a split
  // layer's own experts only), or expert by expert for large passes: cuda_exl3.cpp.
  const bool exl3_experts = exl3::is_exl3_linear(ck, fp + ".experts.0.w1");
  if (!exl3_experts) {
    bank(b.w1, "w1", dim, inter);
    bank(b.w2, "w2", inter, dim);
    bank(b.w3, "w3", dim, inter);
  }
  const dist::Range inter_rows = split ? tp_share(inter, align, "shared-expert columns") : dist::Range{0, inter};
  b.sh_w1 = upload_linear_rows(fp + ".shared_experts.w1", dim, inter, inter_rows.begin, inter_rows.end, kAuto);
  b.sh_w2 = upload_linear_rows(fp + ".shared_experts.w2", inter, dim, dim_rows.begin, dim_rows.end, kAuto);
  b.sh_w3 = upload_linear_rows(fp + ".shared_experts.w3", dim, inter, inter_rows.begin, inter_rows.end, kAuto);
  b.sh_inter_begin = inter_rows.begin;
  b.sh_dim_begin = dim_rows.begin;
  if (exl3_experts) load_exl3_experts(b, fp, experts.end);

  if (!is_dspark && c.is_engram_layer(layer)) {
    b.has_engram = true;
    b.engram_index = c.engram_index(layer);
    const std::string ep = prefix + ".engram";
    b.e_wkv = upload_linear(ep + ".wkv", c.n_engram_columns() * c.engram_head_dim, dim * (hc + 1), kAuto);
    const auto q = load_f32(ck, ep + ".q_weight", {hc, dim});
    const auto k = load_f32(ck, ep + ".k_weight", {hc, dim});
    std::vector<float> g(q.size());
    for (size_t i = 0; i < q.size(); ++i) g[i] = q[i] * k[i];
    b.e_gate_w = DeviceBuffer::from(g);
    weight_bytes += static_cast<int64_t>(b.e_gate_w.bytes());
  }
}

void Impl::load(const std::string& dir) {
  cfg = load_model_config(dir + "/config.json");
  const auto problems = validate_config(cfg);
  if (!problems.empty())
    fail("{}/config.json: {}{}", dir, problems.front(),
         problems.size() > 1 ? fmt::format(" (and {} more)", problems.size() - 1) : std::string());
  const ModelConfig& c = cfg;
  DSV_CHECK(c.n_shared_experts == 1, "config: n_shared_experts = {} (the reference supports exactly 1)",
            c.n_shared_experts);
  DSV_CHECK(c.hc_mult >= 1 && c.hc_mult <= 16, "config: hc_mult = {} out of range", c.hc_mult);
  DSV_CHECK(c.head_dim % 32 == 0 && c.index_head_dim % 32 == 0 && c.hidden_size % 32 == 0,
            "config: hidden_size, head_dim and index_head_dim must be multiples of 32");
  DSV_CHECK(c.scoring_func == "sqrtsoftplus" || c.scoring_func == "sigmoid",
            "config: scoring_func '{}' is not supported by the CUDA model backend", c.scoring_func);
  DSV_CHECK(opts.max_chunk_tokens >= 1, "CUDA model: max_chunk_tokens must be positive, got {}", opts.max_chunk_tokens);
  DSV_CHECK(opts.max_logit_rows >= 1, "CUDA model: max_logit_rows must be positive, got {}", opts.max_logit_rows);
  DSV_CHECK(opts.index_score_slice_bytes >= 1, "CUDA model: index_score_slice_bytes must be positive, got {}",
            opts.index_score_slice_bytes);
  int n_dev = 0;
  ops::gpu::check_cuda(cudaGetDeviceCount(&n_dev), "cudaGetDeviceCount");
  DSV_CHECK(opts.device >= 0 && opts.device < n_dev, "CUDA device {} does not exist ({} devices)", opts.device, n_dev);
  ops::gpu::check_cuda(cudaSetDevice(opts.device), "cudaSetDevice");
  ops::gpu::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  tp_setup();  // tensor parallelism: this rank's share is what load_block and the head take

  CheckpointOpenOptions co;
  if (!opts.engram_storage.engram_packed.empty()) co.engram_elsewhere = "--engram-packed " + opts.engram_storage.engram_packed;
  else if (!opts.engram_storage.engram_dir.empty()) co.engram_elsewhere = "--engram-dir " + opts.engram_storage.engram_dir;
  else if (opts.engram_store) co.engram_elsewhere = "the Engram store given to the model";
  ckpt = Checkpoint::open(dir, co);

  max_context = opts.max_context > 0 ? opts.max_context : std::min<int64_t>(c.max_position_embeddings, 32768);
  DSV_CHECK(max_context <= c.max_position_embeddings, "CUDA model: max_context {} exceeds max_position_embeddings {}",
            max_context, c.max_position_embeddings);

  // Weights go up through pinned staging (cuda_upload.h); `staging` is cleared on every exit, and
  // the uploader (destroyed after that) waits for the copies still in flight.
  StagedUploader uploader;
  staging = &uploader;
  struct ClearStaging {
    Impl* m;
    ~ClearStaging() { m->staging = nullptr; }
  } clear_staging{this};
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const auto t_weights = std::chrono::steady_clock::now();

  const TensorInfo& emb = ckpt->get("embed.weight");
  DSV_CHECK(emb.shape == std::vector<int64_t>({c.vocab_size, c.hidden_size}) && emb.dtype == DType::BF16,
            "embed.weight: the CUDA model backend needs BF16 [{}, {}], got {} {}", c.vocab_size, c.hidden_size,
            dtype_name(emb.dtype), emb.shape_str());
  embed = DeviceBuffer(emb.nbytes);
  upload_bytes(staging, embed, emb.data, emb.nbytes);
  weight_bytes += static_cast<int64_t>(embed.bytes());
  // Tensor parallelism: the head's vocabulary rows [vocab_begin, vocab_end) (cuda_tp.cpp).
  vocab_begin = 0;
  vocab_end = c.vocab_size;
  const bool exl3_head = exl3::is_exl3_linear(*ckpt, "head");
  if (tp_world > 1) {
    // 32: aligned logit columns; 128: whole Hadamard blocks of an EXL3 head (upload_exl3)
    const dist::Range vr = tp_share(c.vocab_size, exl3_head ? 128 : 32, "vocabulary");
    vocab_begin = vr.begin;
    vocab_end = vr.end;
    head_split = true;
  }
  if (exl3_head) {  // head_bits 1..8 (EXL3.md §1.8)
    head_exl3 = upload_exl3("head", c.hidden_size, c.vocab_size, vocab_begin, vocab_end);
  } else {
    const TensorInfo& hw = ckpt->get("head.weight");
    DSV_CHECK(hw.shape == std::vector<int64_t>({c.vocab_size, c.hidden_size}),
              "tensor head.weight has shape {}, expected [{}, {}]", hw.shape_str(), c.vocab_size, c.hidden_size);
    const int64_t rows = vocab_end - vocab_begin;
    if (hw.dtype == DType::BF16) {
      const size_t bytes = static_cast<size_t>(rows * c.hidden_size) * 2;
      head = DeviceBuffer(bytes);
      upload_bytes(staging, head, hw.data + static_cast<size_t>(vocab_begin * c.hidden_size) * 2, bytes);
      head_type = DenseType::BF16;
    } else {
      DSV_CHECK(hw.dtype == DType::F16 || hw.dtype == DType::F32,
                "head.weight: dtype {} where BF16/F16/F32 is expected", dtype_name(hw.dtype));
      const std::vector<float> all = tensor_to_f32(hw);
      head = DeviceBuffer::from(std::vector<float>(all.begin() + vocab_begin * c.hidden_size,
                                                   all.begin() + vocab_end * c.hidden_size));
      head_type = DenseType::F32;
    }
    weight_bytes += static_cast<int64_t>(head.bytes());
  }
  final_norm = DeviceBuffer::from(load_f32(*ckpt, "norm.weight", {c.hidden_size}));
  blocks.resize(static_cast<size_t>(c.num_hidden_layers));
  const auto t_layers = std::chrono::steady_clock::now();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) load_block(blocks[static_cast<size_t>(l)], l);
  const double layers_s = seconds_since(t_layers);
  if (opts.dspark) load_dspark(*this);  // the mtp.* drafter, when the config has one (cuda_dspark.cpp)
  uploader.finish();
  staging = nullptr;
  {
    // Start-up phases (issue 11): host conversions and staging overlap the copies to the device.
    const double s = seconds_since(t_weights), gib = static_cast<double>(uploader.bytes_uploaded()) / 1073741824.0;
    spdlog::info("cuda model: weights uploaded in {:.2f} s ({:.2f} GiB staged, {:.1f} GiB/s); {} layers {:.2f} s "
                 "({:.3f} s per layer)",
                 s, gib, s > 0 ? gib / s : 0.0, blocks.size(), layers_s,
                 blocks.empty() ? 0.0 : layers_s / static_cast<double>(blocks.size()));
  }

  engram_hash = build_engram_hashes(c);
  engram_store = opts.engram_store ? opts.engram_store : engram::open_engram_store(c, ckpt.get(), opts.engram_storage);
  if (!c.engram_layer_ids.empty()) {
    DSV_CHECK(engram_store != nullptr, "this model has Engram layers but no Engram table rows were found");
    DSV_CHECK(engram_store->geometry().fingerprint() == engram::EngramGeometry::from_config(c).fingerprint(),
              "engram store geometry '{}' does not match this config ('{}')", engram_store->geometry().fingerprint(),
              engram::EngramGeometry::from_config(c).fingerprint());
    engram_row_bytes = engram_store->geometry().row_bytes;
    token_map = load_engram_token_map(opts.engram_token_map, c, &engram_pad);
  }
  alloc_scratch();
  alloc_exl3_workspaces();
  if (tp)  // the banks' local expert ids of one pass (cuda_tp.cpp)
    tp_ids = DeviceBuffer(static_cast<size_t>(sc.m * std::max(c.num_experts_per_tok, c.dspark_topk())) * 4);
  if (tp) {
    tp_zero_ids = DeviceBuffer(static_cast<size_t>(sc.m) * 4);
    ops::gpu::check_cuda(cudaMemset(tp_zero_ids.get(), 0, tp_zero_ids.bytes()), "zero ids");
  }
  const auto env_is = [](const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && std::string(v) == value;
  };
  // The environment can ask for sequential block sums in every process of a run (a TP worker builds
  // its own options), so a run can be made bit-identical to the CPU engine without a rebuild.
  if (env_is("DSV41_EXACT_BLOCK_SUMS", "1")) opts.exact_block_sums = true;
  // Benchmarks compare the EXL3 MoE's two forms in one binary (0: always the grouped kernels).
  if (const char* v = std::getenv("DSV41_EXL3_BY_EXPERT_MIN_TOKENS")) {
    char* end = nullptr;
    const long long t = std::strtoll(v, &end, 10);
    DSV_CHECK(end != v && *end == '\0' && t >= 0, "DSV41_EXL3_BY_EXPERT_MIN_TOKENS={}: expected a token count >= 0", v);
    opts.exl3_by_expert_min_tokens = t;
  }
  device_index_topk = !opts.host_index_topk && !env_is("DSV41_HOST_INDEX_TOPK", "1");
  if (!tp) {  // decode steps in CUDA graphs (tensor parallelism keeps its collectives eager)
    graphs = std::make_unique<StepGraphs>(stream);
    graphs_on = (opts.cuda_graphs || env_is("DSV41_CUDA_GRAPHS", "1")) && !env_is("DSV41_NO_GRAPHS", "1");
    device_picks = !env_is("DSV41_NO_DEVICE_PICK", "1");
  }
  // Weight uploads ran on the legacy stream, which the model's non-blocking stream does not wait for.
  ops::gpu::check_cuda(cudaDeviceSynchronize(), "weight upload");
  const CudaMemoryBreakdown mem = memory_breakdown();
  const auto mib = [](int64_t b) { return static_cast<double>(b) / 1048576.0; };
  // The arena's phases (cuda_scratch_plan.h): the common pieces, then one region that the
  // attention, MoE, Engram and head buffers share (the largest of them sizes it).
  const auto phase_mib = [&](ScratchPhase ph) { return mib(scratch_phase_bytes[static_cast<size_t>(ph)]); };
  spdlog::info("cuda model: {} layers on device {}; memory: weights {:.1f} MiB (fp8 {:.1f}, fp4 {:.1f}, exl3 {:.1f}, "
               "dense {:.1f}), state {:.2f} MiB per sequence of {} tokens, scratch {:.1f} MiB ({} tokens per pass; "
               "common {:.1f} + the largest of attention {:.1f}, MoE {:.1f}, Engram {:.1f}, head {:.1f}; Engram row "
               "staging {:.2f} MiB of it), pinned host {:.1f} MiB; decode CUDA graphs {}; FP8/FP4 block sums {}",
               blocks.size(), opts.device, mib(mem.weights), mib(mem.weights_fp8), mib(mem.weights_fp4),
               mib(mem.weights_exl3), mib(mem.weights_dense), mib(mem.state_per_sequence), max_context,
               mib(mem.scratch), sc.m, phase_mib(ScratchPhase::kCommon), phase_mib(ScratchPhase::kAttention),
               phase_mib(ScratchPhase::kMoe), phase_mib(ScratchPhase::kEngram), phase_mib(ScratchPhase::kHead),
               mib(mem.engram_staging), mib(mem.pinned_host), graphs_on ? "on" : "off",
               opts.exact_block_sums ? "sequential (exact)" : "tensor core");
}

void Impl::count_weight_bytes(const GpuLinear& l) {
  const auto bytes = static_cast<int64_t>(l.w.bytes() + l.s.bytes());
  if (l.kind == GpuLinear::Kind::Fp8) weight_bytes_fp8 += bytes;
  else if (l.kind == GpuLinear::Kind::Fp4) weight_bytes_fp4 += bytes;
  else if (l.kind == GpuLinear::Kind::Exl3) weight_bytes_exl3 += bytes;
}

CudaMemoryBreakdown Impl::memory_breakdown() const {
  CudaMemoryBreakdown m;
  m.weights = weight_bytes;
  m.state_per_sequence = state_bytes();
  m.scratch = static_cast<int64_t>(sc.arena.bytes() + exl3_ws.bytes() + exl3_moe_ws.bytes());
  m.weights_fp8 = weight_bytes_fp8;
  m.weights_fp4 = weight_bytes_fp4;
  m.weights_exl3 = weight_bytes_exl3;
  m.weights_dense = weight_bytes - weight_bytes_fp8 - weight_bytes_fp4 - weight_bytes_exl3;
  m.engram_staging = static_cast<int64_t>(cfg.engram_layer_ids.size()) * sc.m * cfg.n_engram_columns() * engram_row_bytes;
  m.pinned_host = static_cast<int64_t>(engram_host.bytes() + scores_host.bytes() + topk_host.bytes());
  return m;
}

void Impl::alloc_scratch() {
  const ModelConfig& c = cfg;
  const int64_t m = opts.max_chunk_tokens, cols = c.n_engram_columns();
  const int64_t K = std::max(c.num_experts_per_tok, c.dspark_topk()), E = std::max(c.n_routed_experts, c.dspark_experts());
  // The layout (which buffers share memory, and why) is plan_cuda_scratch's (cuda_scratch_plan.h):
  // the start-up budget reads the same plan, so its estimate is this arena's size.
  ScratchPlanInputs in;
  in.tokens = m;
  in.max_context = max_context;
  in.logit_rows = opts.max_logit_rows;
  in.score_slice_bytes = opts.index_score_slice_bytes;
  in.tensor_parallel = tp != nullptr;
  const ScratchPlan plan = plan_cuda_scratch(c, in);
  DSV_ASSERT(plan.moe_sort_ints == ops::gpu::moe_grouped_sort_ints(m * K, E), "scratch plan: {} MoE sort ints, {} needed",
             plan.moe_sort_ints, ops::gpu::moe_grouped_sort_ints(m * K, E));
  DSV_ASSERT(engram_row_bytes == 0 || plan.engram_raw_bytes == static_cast<int64_t>(c.engram_layer_ids.size()) * m *
                                                                   cols * engram_row_bytes,
             "scratch plan: Engram rows of {} bytes", engram_row_bytes);

  DSV_ASSERT(plan.rows16_bytes == (plan.rows16_in > 0 ? ops::gpu::lin8_rows16_bytes(m, plan.rows16_in) : 0),
             "scratch plan: {} bytes of f16 rows", plan.rows16_bytes);
  Scratch& s = sc;
  s.m = m;
  s.rows16_bytes = plan.rows16_bytes;
  s.logit_rows = plan.logit_rows;
  s.t_max = plan.t_max;
  s.score_slice_floats = plan.slicing.slice_floats();
  s.score_buffers = plan.slicing.buffers;
  s.moe_sort_ints = plan.moe_sort_ints;
  s.cand_blocks = plan.cand_blocks;
  s.cand_rows = plan.cand_rows;
  using P = ScratchPiece;
  std::array<void**, kScratchPieces> field{};
  auto bind = [&](P p, auto*& ptr) { field[static_cast<size_t>(p)] = reinterpret_cast<void**>(&ptr); };
  bind(P::kH, s.h), bind(P::kPre, s.pre), bind(P::kX, s.x), bind(P::kY, s.y), bind(P::kMixA, s.mix_a);
  bind(P::kMixF, s.mix_f), bind(P::kCodes, s.codes), bind(P::kActScales, s.act_scales), bind(P::kXCodes, s.x_codes);
  bind(P::kXScales, s.x_scales), bind(P::kTokens, s.tokens), bind(P::kSlots, s.slots), bind(P::kEngramRaw, s.engram_raw);
  bind(P::kPositions, s.positions), bind(P::kMixCounters, s.mix_counters), bind(P::kBatchPools, s.batch_pools);
  bind(P::kQr, s.qr), bind(P::kQ, s.q), bind(P::kKv, s.kv), bind(P::kO, s.o), bind(P::kZ, s.z);
  bind(P::kKvBf16, s.kv_bf16), bind(P::kStaged, s.staged), bind(P::kQrCodes, s.qr_codes), bind(P::kQrScales, s.qr_scales);
  bind(P::kCA, s.c_a), bind(P::kCG, s.c_g), bind(P::kCLatent, s.c_latent), bind(P::kCWork, s.c_work), bind(P::kQi, s.qi);
  bind(P::kIw, s.iw), bind(P::kScores, s.scores), bind(P::kScoreIdx, s.score_idx), bind(P::kTopk, s.topk), bind(P::kList, s.list);
  bind(P::kPoolA, s.pool_a), bind(P::kPoolB, s.pool_b), bind(P::kCandKeep, s.cand_keep), bind(P::kRows16, s.rows16);
  bind(P::kBlockScores, s.block_scores), bind(P::kBlockIdx, s.block_idx), bind(P::kBlockSel, s.block_sel);
  bind(P::kIds, s.ids), bind(P::kRouteW, s.route_w), bind(P::kRouteScratch, s.route_scratch), bind(P::kEg, s.eg);
  bind(P::kEu, s.eu), bind(P::kRouted, s.routed), bind(P::kSg, s.sg), bind(P::kShared, s.shared);
  bind(P::kMoeSort, s.moe_sort), bind(P::kExl3Rows, s.exl3_rows);
  bind(P::kEngramRows, s.engram_rows), bind(P::kEngramKv, s.engram_kv);
  bind(P::kLogits, s.logits);
  s.arena = DeviceBuffer(static_cast<size_t>(plan.total));
  auto* base = static_cast<uint8_t*>(s.arena.get());
  for (const ScratchPlanPiece& p : plan.pieces) {
    void** dst = field[static_cast<size_t>(p.id)];
    DSV_ASSERT(dst != nullptr, "scratch piece {} has no Scratch field", static_cast<int>(p.id));
    *dst = base + p.offset;
  }
  s.su = s.sg + m * c.moe_intermediate_size;
  if (plan.at(P::kExl3Rows).bytes == 0) s.exl3_rows = nullptr;  // not an EXL3 checkpoint
  scratch_phase_bytes = plan.phase_bytes;
  // (a memset may return before it is done: the sync keeps it ahead of any stream's first kernel)
  ops::gpu::check_cuda(cudaMemset(s.mix_counters, 0, static_cast<size_t>(m) * 4), "mix counters zero");
  ops::gpu::check_cuda(cudaDeviceSynchronize(), "mix counters zero");
  // Engram row slots are the identity: pass rows are staged in output order.
  if (cols > 0) {
    std::vector<int32_t> iota(static_cast<size_t>(m * cols));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<int32_t>(i);
    ops::gpu::check_cuda(cudaMemcpy(s.slots, iota.data(), iota.size() * 4, cudaMemcpyHostToDevice), "slots upload");
    engram_host.resize(static_cast<size_t>(plan.engram_raw_bytes));
  }
  scores_host.resize(static_cast<size_t>(plan.slicing.floats()));
  topk_host.resize(static_cast<size_t>(m * std::max<int64_t>(1, c.index_topk)));
  picks = DeviceBuffer(static_cast<size_t>(s.logit_rows) * 4);
  picks_host.resize(static_cast<size_t>(s.logit_rows));
}

}  // namespace dsv41::model::cuda
#endif
