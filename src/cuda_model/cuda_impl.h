// Internals of the CUDA model backend (include/dsv41/model/cuda_model.h): device weights, the
// per-sequence device state, the scratch arena, and the forward pieces (src/cuda_model/*.cpp).
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv41/engram/row_store.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/ops/gpu_buffer.h"
#include "dsv41/ops/gpu_ops.h"
#include "model/engram_hash.h"

namespace dsv41::model::cuda {

using ops::gpu::DenseType;
using ops::gpu::DeviceBuffer;

// A linear on the device: FP8 block-scaled (Lin8), FP4 (Lin4, a bank of one) or dense BF16/F32.
struct GpuLinear {
  enum class Kind { Fp8, Fp4, Dense };
  Kind kind = Kind::Dense;
  DeviceBuffer w, s;  // codes/packed/dense values; E8M0 scales (Fp8, Fp4)
  DenseType dense_type = DenseType::BF16;
  int64_t in = 0, out = 0;
  bool loaded() const { return out > 0; }
};

// Routed experts of a layer stored back to back for Lin4 (packed [E][out][in/2], scales [E][out][in/32]).
struct GpuExpertBank {
  DeviceBuffer packed, scales;
  int64_t in = 0, out = 0, n = 0;
};

struct GpuBlock {
  int64_t layer = 0, ratio = 0;
  DeviceBuffer freqs;  // RoPE frequencies of this layer's ratio [rope_dim/2]
  DeviceBuffer attn_norm, ffn_norm;
  DeviceBuffer hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  // attention
  GpuLinear wq_a, wq_b, wkv, wo_b;
  DeviceBuffer wo_a;  // [G·R][in_g], grouped dense
  DenseType wo_a_type = DenseType::BF16;
  DeviceBuffer q_norm, kv_norm, sink;
  // compressor (KV sources) and index keys
  bool has_compressor = false, has_index_keys = false;
  DeviceBuffer c_wkv, c_wgate, c_norm, i_wk, i_k_norm;
  DenseType c_wkv_type = DenseType::BF16;
  // indexer (index sources)
  bool has_indexer = false;
  GpuLinear i_wq_b, i_weights_proj;
  // MoE
  int64_t n_experts = 0, top_k = 0;
  DeviceBuffer gate_w, gate_bias;
  GpuExpertBank w1, w2, w3;
  GpuLinear sh_w1, sh_w2, sh_w3;
  // Engram
  bool has_engram = false;
  int64_t engram_index = -1;
  GpuLinear e_wkv;
  DeviceBuffer e_gate_w;  // [hc][dim] fp32(q)·fp32(k)
};

// One KV source's compressed cache on the device.
struct GpuKvSource {
  DeviceBuffer compressed, index_keys, carry_kv, carry_score;
  int64_t capacity = 0, n_entries = 0;
};

struct CudaSeqState final : SeqState {
  std::vector<DeviceBuffer> ring;   // [layer] -> [window][head_dim] bf16
  std::vector<GpuKvSource> kv;      // [layer] (KV sources only)
  std::vector<int64_t> engram_history;  // compressed ids of the last max_ngram-1 tokens, oldest first
  int64_t last_key_publisher = -1;
  int64_t capacity_tokens = 0;
  const void* owner = nullptr;
};

// The scratch arena: one allocation carved into the forward's buffers for `m` tokens per pass.
struct Scratch {
  DeviceBuffer arena;
  int64_t m = 0, t_max = 0;  // tokens per pass, score columns
  float *h = nullptr, *pre = nullptr, *x = nullptr, *y = nullptr, *mix_a = nullptr, *mix_f = nullptr;
  float *qr = nullptr, *q = nullptr, *kv = nullptr, *o = nullptr, *z = nullptr;
  uint16_t *kv_bf16 = nullptr, *staged = nullptr;
  uint8_t* codes = nullptr;
  float* act_scales = nullptr;
  float *c_a = nullptr, *c_g = nullptr, *c_latent = nullptr, *c_work = nullptr;
  float *qi = nullptr, *iw = nullptr, *scores = nullptr;
  int32_t *topk = nullptr, *list = nullptr;
  const uint16_t** pool_a = nullptr;
  const uint16_t** pool_b = nullptr;
  int32_t *ids = nullptr, *tokens = nullptr, *slots = nullptr;
  float *route_w = nullptr, *route_scratch = nullptr;
  float *eg = nullptr, *eu = nullptr, *routed = nullptr, *sg = nullptr, *su = nullptr, *shared = nullptr;
  uint8_t* engram_raw = nullptr;
  float *engram_rows = nullptr, *engram_kv = nullptr;
  float* logits = nullptr;
};

// Carries the index sources' outputs down the stack within one pass (ChunkShared of the CPU engine).
// The top-k selections run on the host over the device's scores: their tie order is that of the
// CPU engine's torch_topk_indices (std::partial_sort / nth_element), which frequent exact ties
// (relu'd bf16 index scores) make visible; the GPU top-k kernel breaks ties by lowest index.
struct PassShared {
  int64_t topk_len = -1;  // -1: no index source has run in this pass
  bool has_candidates = false;
  std::vector<std::vector<uint8_t>> candidates;  // [query] -> mask over the candidate source's entries
};

// Geometry of one pass: tokens [start, start+n) of a chunk whose layout ends at layout_end.
struct Pass {
  int64_t start = 0, n = 0, layout_end = 0;
  bool decode = false;
};

struct Impl {
  ModelConfig cfg;
  CudaModelOptions opts;
  std::unique_ptr<Checkpoint> ckpt;
  DeviceBuffer embed;  // [vocab][dim] bf16
  DeviceBuffer head;   // [vocab][dim]
  DenseType head_type = DenseType::BF16;
  DeviceBuffer final_norm;
  std::vector<GpuBlock> blocks;
  std::vector<EngramLayerHash> engram_hash;
  std::vector<int32_t> token_map;
  int64_t engram_pad = 0, engram_row_bytes = 0;
  std::shared_ptr<engram::EngramStore> engram_store;
  int64_t max_context = 0;
  int64_t weight_bytes = 0;
  Scratch sc;
  cudaStream_t stream = nullptr;
  std::vector<uint8_t> engram_host;  // staging of raw Engram rows for one pass
  std::vector<float> scores_host;    // index scores of one pass [n][T]
  std::vector<int32_t> topk_host;    // selections of one pass [n][k]

  ~Impl();
  // ---- loading (src/cuda_model/cuda_load.cpp) ----
  void load(const std::string& dir);
  void load_block(GpuBlock& b, int64_t layer);
  GpuLinear upload_linear(const std::string& prefix, int64_t in, int64_t out, int kind);
  void alloc_scratch();
  // ---- state (src/cuda_model/cuda_state.cpp) ----
  std::unique_ptr<CudaSeqState> make_state() const;
  int64_t state_bytes() const;
  CudaSeqState& state_of(SeqState& s) const;
  // ---- forward (src/cuda_model/cuda_forward.cpp, cuda_attention.cpp) ----
  void forward(CudaSeqState& st, const int32_t* tokens, int64_t n, bool all_logits, std::vector<float>* logits,
               BlockDump* dump);
  void run_pass(CudaSeqState& st, const int32_t* tokens, const Pass& p, int64_t logit_rows_from,
                float* logits_host, BlockDump* dump);
  void block_forward(const GpuBlock& b, CudaSeqState& st, PassShared& shared, const Pass& p);
  void attention(const GpuBlock& b, CudaSeqState& st, PassShared& shared, const Pass& p);
  void moe(const GpuBlock& b, int64_t n);
  void engram(const GpuBlock& b, const engram::EngramFetch& fetch, const std::vector<int64_t>& ids, int64_t n);
  // y[m][y_stride] = lin(x[m][x_stride]) (bf16-rounded when `round`).
  void linear(const GpuLinear& l, const float* x, int64_t x_stride, int64_t m, float* y, int64_t y_stride,
              bool round);
};

}  // namespace dsv41::model::cuda
#endif
