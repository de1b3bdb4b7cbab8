// Internals of the CUDA model backend (include/dsv41/model/cuda_model.h): device weights, the
// per-sequence device state, the scratch arena, and the forward pieces (src/cuda_model/*.cpp).
#pragma once
#if DSV41_HAS_CUDA
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda_model/cuda_graph.h"
#include "cuda_model/cuda_host_phases.h"
#include "cuda_model/cuda_pinned.h"
#include "cuda_model/cuda_state_memory.h"
#include "dsv41/engram/row_store.h"
#include "dist/nccl_collective.h"
#include "dsv41/dist/collective.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/model/cuda_scratch_plan.h"
#include "dsv41/ops/exl3_gpu.h"
#include "dsv41/ops/gpu_buffer.h"
#include "dsv41/ops/gpu_ops.h"
#include "model/engram_hash.h"

namespace dsv41::model::cuda {

using ops::gpu::DenseType;
using ops::gpu::DeviceBuffer;

// A linear on the device: FP8 block-scaled (Lin8), FP4 (Lin4, a bank of one), dense BF16/F32, or
// EXL3 (src/cuda_model/cuda_exl3.cpp: trellis in w, fp16 suh|svh|bias in s, run by the EXL3 GEMM).
struct GpuLinear {
  enum class Kind { Fp8, Fp4, Dense, Exl3 };
  Kind kind = Kind::Dense;
  DeviceBuffer w, s;  // codes/packed/dense values/trellis; E8M0 scales (Fp8, Fp4) or suh|svh|bias (Exl3)
  DenseType dense_type = DenseType::BF16;
  ops::Exl3Matrix exl3;  // Exl3: device pointers into w and s, padded k/n, K and codebook
  int64_t in = 0, out = 0;
  bool loaded() const { return out > 0; }
};

// Routed experts of a layer stored back to back for Lin4 (packed [E][out][in/2], scales [E][out][in/32]).
struct GpuExpertBank {
  DeviceBuffer packed, scales;
  int64_t in = 0, out = 0, n = 0;
};

// EXL3 routed experts of a layer for the grouped MoE kernels: per-expert linears and the device
// tables of their matrices ([n_experts] routed, then the shared expert at index n_experts).
struct GpuExl3Experts {
  std::vector<GpuLinear> w1, w2, w3;  // routed experts (the shared expert's linears stay in GpuBlock)
  DeviceBuffer gate, up, down;        // ops::Exl3Matrix [n_experts + 1]
  int hidden = 0, inter = 0, max_bits = 0;  // padded sizes; largest K over all tables
  // The bits and codebook every gate/up (w1, w3) matrix shares, and every down (w2) matrix; bits 0
  // where they differ (ops::MoeParams: the stream path needs both).
  int gate_up_bits = 0, gate_up_codebook = 0, down_bits = 0, down_codebook = 0;
  bool loaded() const { return !w1.empty(); }
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
  std::vector<GpuLinear> wo_a_slices;  // EXL3 layout (`wo_a.slice.{g}`, EXL3 or dense): one per group
  DeviceBuffer wo_a_batch;  // the slices' Exl3Matrix (device) when all are EXL3 of one shape and kind
  DeviceBuffer q_norm, kv_norm, sink;
  // compressor (KV sources) and index keys
  bool has_compressor = false, has_index_keys = false;
  DeviceBuffer c_wkv, c_wgate, c_norm, i_wk, i_k_norm;
  DenseType c_wkv_type = DenseType::BF16;
  // When a compressor projection is EXL3, both stay linears (c_wkv/c_wgate empty) and run before
  // the compressor step, which then takes their outputs (CompressorWeights::projected).
  GpuLinear c_wkv_lin, c_wgate_lin;
  DenseType i_wk_type = DenseType::BF16;
  // indexer (index sources)
  bool has_indexer = false;
  GpuLinear i_wq_b, i_weights_proj;
  // MoE
  int64_t n_experts = 0, top_k = 0;
  DeviceBuffer gate_w, gate_bias;
  GpuExpertBank w1, w2, w3;
  GpuExl3Experts x_experts;  // EXL3 checkpoints (w1/w2/w3 banks then stay empty)
  GpuLinear sh_w1, sh_w2, sh_w3;
  // Engram
  bool has_engram = false;
  int64_t engram_index = -1;
  GpuLinear e_wkv;
  DeviceBuffer e_gate_w;  // [hc][dim] fp32(q)·fp32(k)
  // Tensor parallelism (cuda_tp.cpp): this rank's share. A block loaded whole (TP 1, DSpark
  // stages) has split = false, all heads/groups and begin offsets 0.
  bool split = false;
  int64_t head_begin = 0, n_heads = 0, group_begin = 0, n_groups = 0;  // whole output groups
  int64_t wo_b_begin = 0, sh_inter_begin = 0, sh_dim_begin = 0;      // column slices (output rows)
  int64_t expert_begin = 0;                                          // routed ids [begin, begin + w1.n)
};

// One KV source's compressed cache on the device (spans of the state's blocks, cuda_state.cpp).
struct GpuKvSource {
  StateSpan compressed, index_keys, carry_kv, carry_score;
  int64_t capacity = 0, n_entries = 0;
};

// DSpark window of a sequence (cuda_dspark.cpp): per stage a bf16 ring [window][head_dim] of the
// rows derived from the target's committed positions (MODEL.md §6.2), carved from the fixed block.
struct DsparkSeqState {
  std::vector<StateSpan> ring;  // [stage]; empty when the model has no DSpark stages
};

struct CudaSeqState final : SeqState {
  std::vector<StateSpan> ring;      // [layer] -> [window][head_dim] bf16
  std::vector<GpuKvSource> kv;      // [layer] (KV sources only)
  std::vector<int64_t> engram_history;  // compressed ids of the last max_ngram-1 tokens, oldest first
  int64_t last_key_publisher = -1;
  int64_t capacity_tokens = -1;     // context room; -1 until the growing block is sized
  const void* owner = nullptr;
  // Device memory: `fixed` holds the rings and compressor carries, `growing` the compressed KV and
  // index keys sized for capacity_tokens (replaced, contents copied, when the room grows).
  std::pmr::memory_resource* memory = nullptr;
  StateBlock fixed, growing;
  DsparkSeqState dspark;
};

// ActQuant8 codes of `rows` input rows of width k, already in the scratch (written by a norm or
// SwiGLU kernel that quantises its own output, or by Impl::quantize): the caller hands it to every
// FP8/FP4 linear that reads those rows, so the input is quantised once. Empty (codes null): each
// such linear quantises its float input itself. EXL3 and dense linears always read the floats.
struct QuantizedInput {
  const uint8_t* codes = nullptr;  // [rows][k] e4m3 bytes
  const float* scales = nullptr;   // [rows][k/32] power-of-two scales
  int64_t rows = 0, k = 0;
  bool empty() const { return codes == nullptr; }
};

// The scratch arena: one allocation carved into the forward's buffers for `m` tokens per pass. The
// layout is plan_cuda_scratch's (dsv41/model/cuda_scratch_plan.h): buffers of different phases of a
// layer (attention, MoE, Engram, the head) share memory, so a buffer is only valid within its phase.
struct Scratch {
  DeviceBuffer arena;
  int64_t m = 0, t_max = 0;  // tokens per pass, score columns
  int64_t logit_rows = 0;    // rows of `logits`: min(m, CudaModelOptions::max_logit_rows)
  // Index scores (`scores` and Impl::scores_host): score_buffers buffers of score_slice_floats
  // each (index_score_slicing): a pass's rows are scored and selected in slices of at most one
  // buffer, alternating between the two when there are several (Impl::index_score_slices).
  int64_t score_slice_floats = 0, score_buffers = 1;
  float *h = nullptr, *pre = nullptr, *x = nullptr, *y = nullptr, *mix_a = nullptr, *mix_f = nullptr;
  float *qr = nullptr, *q = nullptr, *kv = nullptr, *o = nullptr, *z = nullptr;
  uint16_t *kv_bf16 = nullptr, *staged = nullptr;
  uint8_t* codes = nullptr;
  float* act_scales = nullptr;
  // Codes of the normed rows in x (attention and MoE inputs) and of the normed q latent in qr
  // (QuantizedInput), apart from `codes` so that they outlive the linears quantising elsewhere.
  uint8_t *x_codes = nullptr, *qr_codes = nullptr;
  float *x_scales = nullptr, *qr_scales = nullptr;
  // The tensor-core Lin8 GEMM's scaled path (Lin8Args::rows16): a prefill linear's input rows in f16
  // with their block scales, rows16_bytes of them (0 for an EXL3 checkpoint).
  void* rows16 = nullptr;
  int64_t rows16_bytes = 0;
  float *c_a = nullptr, *c_g = nullptr, *c_latent = nullptr, *c_work = nullptr;
  float *qi = nullptr, *iw = nullptr, *scores = nullptr;
  uint16_t* score_idx = nullptr;  // [score_slice_floats]: gpu::topk_replay's index scratch
  // Candidate blocks made on the device: cand_keep [m][keep_words(cand_blocks)] (a row's kept
  // blocks as bits, at the stride of its source width's blocks' words, or of cand_blocks' words
  // under batched decode), and the block scoring's scratch for cand_rows rows.
  int64_t cand_blocks = 1, cand_rows = 1;
  uint32_t* cand_keep = nullptr;
  float* block_scores = nullptr;
  uint16_t* block_idx = nullptr;
  int32_t* block_sel = nullptr;
  int32_t *topk = nullptr, *list = nullptr;
  const uint16_t** pool_a = nullptr;
  const uint16_t** pool_b = nullptr;
  int32_t *ids = nullptr, *tokens = nullptr, *slots = nullptr;
  float *route_w = nullptr, *route_scratch = nullptr;
  float *eg = nullptr, *eu = nullptr, *routed = nullptr, *sg = nullptr, *su = nullptr, *shared = nullptr;
  uint8_t* engram_raw = nullptr;
  float *engram_rows = nullptr, *engram_kv = nullptr;
  float* logits = nullptr;
  int32_t* moe_sort = nullptr;  // grouped MoE bucketing (gpu::moe_grouped), moe_sort_ints values
  int64_t moe_sort_ints = 0;
  float* exl3_rows = nullptr;  // EXL3 large passes: [m*top_k][dim] expert-sorted rows (cuda_exl3.cpp)
  // Batched decode (cuda_decode_batch.cpp): the rows' positions [m], and per layer the rows' window
  // rings then their compressed-KV pools [layers][2][m] (sparse attention's per-query pools).
  int64_t* positions = nullptr;
  // [m] zeroed counters of the mHC mix (HcMixArgs::counters): the split runs in the dots' launch.
  unsigned* mix_counters = nullptr;
  const uint16_t** batch_pools = nullptr;
};

// Carries the index sources' outputs down the stack within one pass (ChunkShared of the CPU engine).
// The top-k selections run on the host over the device's scores: their tie order is that of the
// CPU engine's torch_topk_indices (std::partial_sort / nth_element), which frequent exact ties
// (relu'd bf16 index scores) make visible; the GPU top-k kernel breaks ties by lowest index.
struct PassShared {
  int64_t topk_len = -1;  // -1: no index source has run in this pass
  bool has_candidates = false;
  // The candidate source ran on the device: its masks are in Scratch::cand_keep, over
  // candidate_cols columns, and the index layers after it select on the device too.
  bool device_candidates = false;
  int64_t candidate_cols = 0;
  std::vector<std::vector<uint8_t>> candidates;  // [query] -> mask over the candidate source's entries
};

// The host part of one query's index selection, in the CPU engine's order: at the candidate source
// layer its candidate-block mask is made (*candidates), at later layers that mask (when present)
// sends the other entries to -inf; then the top-k set by index into out[0, k), entries at or beyond
// the query's n_vis visible ones as -1. scores: the query's T index scores (not modified).
void select_index_row(const float* scores, int64_t T, int64_t n_vis, int64_t k, const ModelConfig& c,
                      bool is_cand_src, bool uses_cand, std::vector<uint8_t>* candidates, int32_t* out);

// Geometry of one pass: tokens [start, start+n) of a chunk whose layout ends at layout_end.
// decode: every row is a one-token decode step; n > 1 only in a batched decode pass (DecodeBatch),
// whose rows belong to different sequences (start, layout_end then unused).
struct Pass {
  int64_t start = 0, n = 0, layout_end = 0;
  bool decode = false;
};

// A batched decode pass (cuda_decode_batch.cpp): row i is the one-token decode step of seqs[i] at
// position pos[i] (its n_past), computed exactly as that sequence's own decode pass would: every
// row-wise op runs over all rows at once, the per-sequence parts (ring, compressor, indexer,
// top-k, lists, attention pools) against each row's own state.
struct DecodeBatch {
  std::vector<CudaSeqState*> seqs;
  std::vector<int64_t> pos;
  std::vector<PassShared> shared;  // [row]: the row's index-source outputs down the stack
  std::vector<int64_t> topk_off;   // [row]: offset of the row's selections in sc.topk (packed)
  int64_t rows() const { return static_cast<int64_t>(seqs.size()); }
};

// Engram hash ids of a pass's rows and the prefetch of their table rows (cpu_model.cpp).
struct EngramPass {
  std::vector<int64_t> hash_ids;              // [n][n_engram][cols]
  std::vector<std::vector<int64_t>> rows;     // [engram layer] -> [n * cols]
  std::vector<std::shared_ptr<engram::EngramFetch>> fetch;  // [engram layer]
};

struct DsparkModel;  // the drafter's weights and scratch (cuda_dspark.h)
class StagedUploader;  // pinned-staging weight uploads (cuda_upload.h)

struct Impl {
  ModelConfig cfg;
  CudaModelOptions opts;
  // The running pass (decode steps, solo or batched, and DSpark drafts) gives every row bits that
  // do not depend on the other rows: its FP8 linears take the decode-size tensor-core kernel where
  // it applies, else the sequential block sums (Lin8Args::row_invariant, kernels/ops/
  // lin8_tc_gemv.h), its routed experts the exact per-pair kernels and its dense calls the
  // sequential ones, so a sequence's tokens never depend on the batch it runs in
  // (CudaModelOptions::exact_block_sums puts every pass on the CPU's sequential sums).
  bool row_invariant_pass = false;
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
  int64_t weight_bytes_fp8 = 0, weight_bytes_fp4 = 0, weight_bytes_exl3 = 0;  // the rest is dense
  GpuLinear head_exl3;  // an EXL3 head (head/head_type then stay empty)
  DeviceBuffer exl3_ws, exl3_moe_ws;  // EXL3 GEMM / grouped MoE workspaces (one call at a time)
  size_t exl3_ws_bytes = 0, exl3_moe_ws_bytes = 0;  // sizes gathered while loading
  std::vector<std::array<int32_t, 4>> exl3_shapes;  // (k, n, bits, codebook) already sized
  Scratch sc;
  std::array<int64_t, kScratchPhases> scratch_phase_bytes{};  // the arena's phases (ScratchPlan::phase_bytes)
  cudaStream_t stream = nullptr;
  // Pinned host staging: raw Engram rows of every Engram layer for one pass ([layer][n·cols] rows,
  // uploaded before the pass's first kernel into sc.engram_raw), index scores [n][T], selections [n][k].
  PinnedArray<uint8_t> engram_host;
  PinnedArray<float> scores_host;
  PinnedArray<int32_t> topk_host;
  // Greedy picks of a pass's logit rows (server sampling without the vocabulary download);
  // DSV41_NO_DEVICE_PICK=1 turns them off (logits download as before: A/B runs).
  DeviceBuffer picks;
  PinnedArray<int32_t> picks_host;
  bool device_picks = true;
  // Index top-k on the device (gpu::topk_replay: the CPU engine's selection, ties included) for the
  // layers and widths it takes (index_topk_on_device); DSV41_HOST_INDEX_TOPK=1 keeps every
  // selection on the host (A/B runs).
  bool device_index_topk = true;
  // The partial_sort branch's replay is thousands of dependent heap steps on one GPU thread per
  // row: ~1.5 ms a row at 65,536 columns, ~1.9 ms for 2,048 rows at once, against ~0.14 ms per
  // row on each host thread plus the scores' download (bench/RESULTS.md): at 64 rows the host's
  // threads win, at a pass's 2,048 the device does by far; it takes the branch from this many
  // rows per launch (a score slice's rows: a pass selects slice by slice).
  static constexpr int64_t kDeviceHeapRows = 128;
  // Decode steps in CUDA graphs (cuda_graph.h): graphs is null under tensor parallelism; graphs_on
  // from CudaModelOptions::cuda_graphs and DSV41_NO_GRAPHS (CudaModel::set_cuda_graphs).
  std::unique_ptr<StepGraphs> graphs;
  bool graphs_on = false;
  cudaEvent_t engram_uploaded = nullptr;  // the last Engram staging upload (engram_stage)
  cudaEvent_t scores_ready = nullptr;     // an eager top-k host point's scores download (host_point_wait)
  std::array<cudaEvent_t, 2> score_slice_ready{};  // a later index-score slice's download, per buffer
  HostPhaseTimer host_phases;             // DSV41_HOST_PHASES=1: host time of steps and passes by phase
  // Benchmark only (CudaModel::set_layer_timing): timing events at the layer boundaries of each
  // pass, event i before layer i and event `layers` after the last (layer_boundary).
  bool layer_timing = false;
  std::vector<cudaEvent_t> layer_events;
  std::vector<bool> layer_marked;
  std::shared_ptr<DsparkModel> dspark;  // null: no DSpark stages loaded (cuda_dspark.cpp)
  int64_t dspark_stages = 0;            // DSpark rings per sequence state
  StagedUploader* staging = nullptr;    // set while load() runs: weight uploads go through it
  // Tensor parallelism (cuda_tp.cpp): the collective (device memory, all-reduces on `stream`),
  // this rank, the head's vocabulary slice, and the routed-expert ids of this rank's bank (-1:
  // another rank's expert).
  dist::DeviceCollective* tp = nullptr;
  int tp_rank = 0, tp_world = 1;
  bool head_split = false;
  int64_t vocab_begin = 0, vocab_end = 0;
  DeviceBuffer tp_ids;
  DeviceBuffer tp_zero_ids;  // [m] zeros: a combine of one slot per token (cuda_exl3.cpp)

  ~Impl();
  // Layer boundary i of a pass (0: before the first layer). With layer timing on it records
  // layer_events[i] outside any capture: a decode step in CUDA graphs ends its open segment there
  // (launched, then a new one begins), so the event times the segments as they run. Otherwise,
  // between layers, only the graph split of every layer's own segment.
  void layer_boundary(StepGraphs* graph, int64_t i);
  std::vector<double> layer_times_ms();
  // ---- loading (src/cuda_model/cuda_load.cpp) ----
  void load(const std::string& dir);
  // prefix empty: "layers.<layer>"; is_dspark: a DSpark stage (mtp.<s>: no compressor, indexer or
  // Engram; the dspark_* expert counts).
  void load_block(GpuBlock& b, int64_t layer, const std::string& prefix = {}, bool is_dspark = false);
  GpuLinear upload_linear(const std::string& prefix, int64_t in, int64_t out, int kind);
  // Output rows [row_begin, row_end) of a linear (a column slice under tensor parallelism).
  GpuLinear upload_linear_rows(const std::string& prefix, int64_t in, int64_t out, int64_t row_begin,
                               int64_t row_end, int kind);
  void alloc_scratch();
  void count_weight_bytes(const GpuLinear& l);
  CudaMemoryBreakdown memory_breakdown() const;
  // ---- tensor parallelism (src/cuda_model/cuda_tp.cpp) ----
  void tp_setup();                                   // from opts.tp, before loading
  dist::Range tp_share(int64_t total, int64_t align, const char* what) const;  // this rank's non-empty range
  void tp_zero(float* d, int64_t count);             // zero a buffer a split layer fills in part
  void tp_sum(float* d, int64_t count);              // all-reduce it (every rank adds exact zeros)
  // Where a pass of n tokens keeps the shared expert's gate/up rows and output rows: sc.sg, sc.su
  // and sc.shared; for a split layer back to back with the buffer summed with them (su after sg,
  // shared after the n * top_k routed rows), so each pair takes one all-reduce.
  struct MoeRows {
    float *sg, *su, *shared;
  };
  MoeRows moe_rows(const GpuBlock& b, int64_t n) const;
  // This rank's experts [expert_begin, expert_begin + count) as local ids, others -1 (count < 0:
  // the FP4 bank's).
  const int32_t* tp_local_expert_ids(const GpuBlock& b, int64_t pairs, int64_t count = -1);
  // The host's waits on `stream` inside a step. Under tensor parallelism the stream holds NCCL
  // work that a lost rank would never finish: these poll the collective's liveness (it aborts the
  // communicator, which ends the kernels, and throws) instead of blocking.
  void sync_stream(const char* what);
  void sync_event(cudaEvent_t e, const char* what);
  void step_done(const char* what);  // the step's last wait (then the collectives' timing)
  // ---- EXL3 (src/cuda_model/cuda_exl3.cpp) ----
  // An EXL3 linear, or (tensor parallelism) its outputs [row_begin, row_end) (row_end < 0: all).
  GpuLinear upload_exl3(const std::string& prefix, int64_t in, int64_t out, int64_t row_begin = 0,
                        int64_t row_end = -1);
  // Routed experts [b.expert_begin, expert_end), after the shared expert.
  void load_exl3_experts(GpuBlock& b, const std::string& ffn_prefix, int64_t expert_end);
  void alloc_exl3_workspaces();
  void linear_exl3(const GpuLinear& l, const float* x, int64_t x_stride, int64_t m, float* y, int64_t y_stride,
                   bool round);
  // The wo_a slices as one batched EXL3 call when the block has wo_a_batch and m <= 8 rows (false:
  // the caller runs them one by one): slice g reads x + g·x_step and writes y + g·y_step.
  bool wo_a_batched(const GpuBlock& b, const float* x, int64_t x_stride, int64_t x_step, int64_t m, float* y,
                    int64_t y_stride, int64_t y_step);
  void plan_wo_a_batch(GpuBlock& b);
  void moe_exl3(const GpuBlock& b, int64_t n);
  void moe_exl3_by_expert(const GpuBlock& b, int64_t n);
  // The shared expert of an EXL3 layer apart from the grouped kernels, into moe_rows(b, n).shared
  // (a split layer: its column slices, the gate/up rows all-reduced here, the output rows zero
  // elsewhere and left for the caller's all-reduce).
  void shared_expert_exl3(const GpuBlock& b, int64_t n, const MoeRows& mr);
  CudaPathStats path_stats;  // CudaModel::path_stats
  // ---- state (src/cuda_model/cuda_state.cpp) ----
  std::unique_ptr<CudaSeqState> make_state() const;  // heap state with room for max_context tokens
  // A state whose device buffers come from `memory`, with room for `capacity_tokens` tokens.
  std::unique_ptr<CudaSeqState> make_state(std::pmr::memory_resource* memory, int64_t capacity_tokens) const;
  void reserve_state(CudaSeqState& st, int64_t capacity_tokens) const;  // grows, keeps contents
  int64_t state_bytes() const;  // one state of max_context tokens
  int64_t state_bytes(int64_t capacity_tokens) const;  // device bytes a state of that room takes
  CudaSeqState& state_of(SeqState& s) const;
  // ---- forward (src/cuda_model/cuda_forward.cpp, cuda_attention.cpp) ----
  // `pick` (with logits, not all_logits): the last row's greedy pick goes there instead of its
  // logits (ForwardItem::greedy_id); one-node runs only, otherwise the logits are filled.
  void forward(CudaSeqState& st, const int32_t* tokens, int64_t n, bool all_logits, std::vector<float>* logits,
               BlockDump* dump, int32_t* pick = nullptr);
  // Refuses tokens the model cannot take at the state's position (vocabulary, image, context, capacity).
  void check_tokens(const CudaSeqState& st, const int32_t* tokens, int64_t n) const;
  void run_pass(CudaSeqState& st, const int32_t* tokens, const Pass& p, int64_t logit_rows_from,
                float* logits_host, BlockDump* dump, int32_t* pick = nullptr);
  // Greedy picks of sc.logits rows [0, rows) into picks_host (std::max_element rule), on the stream.
  void pick_rows(int64_t rows);
  // The block around its attention (`attend`: attention of this pass's rows, sc.x -> sc.y, given the
  // codes of the normed rows sc.x).
  void block_forward(const GpuBlock& b, const Pass& p, const std::function<void(const QuantizedInput&)>& attend);
  void attention(const GpuBlock& b, CudaSeqState& st, PassShared& shared, const Pass& p, const QuantizedInput& xq = {});
  // RoPE of the layer's frequencies over n rows of `vecs` vectors; the rows' positions as in `at`
  // (at.positions, or at.pos0 + r·at.pos_step).
  void rope_rows(const GpuBlock& b, const ops::gpu::RopeArgs& at, float* v, int64_t n, int64_t vecs,
                 int64_t vec_stride, int64_t row_stride, bool inverse);
  // RoPE of a row tail at the positions of `at`, for kernels that rotate the rows they write.
  ops::gpu::RopeTail rope_tail(const GpuBlock& b, const ops::gpu::RopeArgs& at, int64_t row_div) const;
  // The attention's projections of n normed rows sc.x (xq: their codes, or empty): q =
  // wq_b(q_norm(wq_a x)) with RoPE into sc.q, and the window KV row QDQ8(RoPE(kv_norm(wkv x))) into
  // sc.kv. Returns the codes of the normed q latent sc.qr (the indexer's wq_b reads it too).
  // kv_bits: when set, the KV rows' bf16 bits also go there ([n][head_dim]).
  QuantizedInput project_q_kv(const GpuBlock& b, int64_t n, const ops::gpu::RopeArgs& at,
                              const QuantizedInput& xq = {}, uint16_t* kv_bits = nullptr);
  // project_q_kv in two parts: the q latent (wq_a, wkv, q_norm; what the compressor's and the
  // indexer's inputs need) and the rest (wq_b and RoPE into sc.q, the window KV row), which reads
  // only sc.qr's codes and sc.kv, so a decode step may issue it after the index scores' download
  // and the GPU runs it while the host waits for the scores and selects the top-k.
  QuantizedInput project_q_latent(const GpuBlock& b, int64_t n, const QuantizedInput& xq);
  void project_q_rest(const GpuBlock& b, int64_t n, const ops::gpu::RopeArgs& at, const QuantizedInput& qrq,
                      uint16_t* kv_bits);
  // The indexer's per-head queries (sc.qi) and head weights (sc.iw) of n rows; qrq / xq: the codes
  // of sc.qr / sc.x, or empty.
  void index_queries(const GpuBlock& b, int64_t n, const ops::gpu::RopeArgs& at, const QuantizedInput& qrq,
                     const QuantizedInput& xq);
  ops::gpu::CompressorWeights compressor_weights(const GpuBlock& b) const;  // the layer's compressor
  // hist(t, out): row t's n-gram window of compressed ids, out[0] its own token, out[k] k back (-1: none).
  EngramPass engram_prepare(int64_t n, const std::function<void(int64_t, int64_t*)>& hist);
  void engram_push_history(CudaSeqState& st, const int32_t* tokens, int64_t n) const;
  void embed_rows(const int32_t* tokens, int64_t n);  // sc.h streams, sc.pre one-hot
  void upload_embed_inputs(const int32_t* tokens, int64_t n);  // the tokens' upload of embed_rows
  void embed_kernel(int64_t n);                                // the rest of embed_rows (streams, sc.pre)
  // Stages every Engram layer's table rows of a pass of n rows (host copy, one upload into
  // sc.engram_raw) before its first kernel, so no Engram layer waits on the host mid-pass.
  void engram_stage(const EngramPass& e, int64_t n);
  const uint8_t* engram_layer_rows(int64_t engram_index, int64_t n) const;  // its rows in sc.engram_raw
  // The graphs for a decode step (null: run it eagerly), and the host points inside a step: the
  // stream is synchronised (ending and launching the open segment first), then resumed.
  StepGraphs* decode_graphs() const;
  void host_point_sync(const char* what);
  void host_point_resume();
  // Eager steps only (no graph capturing): marks the stream's current end (scores_ready) so that
  // work issued after the mark runs on the GPU while host_point_wait blocks on the mark alone.
  bool host_point_can_defer() const;
  void host_point_mark();
  void host_point_wait(const char* what);
  // The index scores' host round trip in `slices` slices (one buffer each, alternating): issue(s,
  // dev, host) enqueues slice s's scoring into dev and its download into host; select(s, host) runs
  // on the host once that download is done. Slice s+1 is issued before the host waits for slice s,
  // so the GPU scores it while the host selects. `deferred` (when set, eager steps only) is issued
  // right after slice 0's download and runs on the GPU during the first wait (host_point_mark).
  // The first wait is the layer's host point (a decode step's graph segment ends there); returns
  // the host time the first wait began (HostPhaseTimer) for the caller's phase accounting.
  // The top-k of rows just scored (gpu::topk_replay over scored.scores, which it consumes) into
  // out [scored.n][k], indices at or beyond a row's visible entries as -1; with positions (batched
  // decode) each row has its own width and count (TopkReplayArgs::positions), scored.T the largest.
  // Whether layer b's index top-k over the columns of `span` positions (a pass's layout end, a
  // decode row's position + 1), for a pass or step of `rows` rows, runs on the device: where
  // gpu::topk_replay takes the width, and in the reference's partial_sort branch (64·index_topk
  // columns and more) only where a launch (a score slice) holds kDeviceHeapRows rows or more, for
  // the index rows and for the candidate source's blocks alike; the candidate source only if every
  // index layer after it can apply its mask on the device, and those layers exactly when it did
  // (PassShared::device_candidates).
  bool index_topk_on_device(const GpuBlock& b, int64_t span, int64_t rows, const PassShared& shared) const;
  // The candidate source's kept blocks of rows just scored into keep (gpu::candidate_blocks).
  void candidate_blocks_on_device(const ops::gpu::IndexerArgs& scored, uint32_t* keep);
  void select_index_rows_on_device(const ops::gpu::IndexerArgs& scored, int64_t k, int32_t* out,
                                   const int64_t* positions = nullptr);
  HostPhaseTimer::Clock::time_point index_score_slices(
      int64_t slices, const std::function<void()>& deferred,
      const std::function<void(int64_t, float*, float*)>& issue,
      const std::function<void(int64_t, const float*)>& select);
  void final_rows(int64_t row0, int64_t rows);         // final collapse, norm and head -> sc.logits
  // ---- batched decode (src/cuda_model/cuda_decode_batch.cpp) ----
  // Rows per batched decode pass: the arena's; EXL3 linears pick their kernel path by row count
  // (int8 with MUL1 up to 4 rows, f16 up to 8), so a model with EXL3 weights keeps to 4 rows, the
  // path of a single row.
  int64_t max_decode_batch() const;
  // Runs every item as the model's forward would, one-token decode steps of distinct sequences
  // together in batched passes.
  void forward_items(std::span<ForwardItem> items);
  void forward_decode_batch(std::span<ForwardItem* const> items);  // one-token decode steps, distinct states
  // pick_out: per row, null or where its greedy pick goes instead of its logits (forward()'s `pick`).
  void run_decode_pass(DecodeBatch& db, const int32_t* tokens, std::span<std::vector<float>* const> logits,
                       std::span<int32_t* const> pick_out = {});
  void attention_batch(const GpuBlock& b, DecodeBatch& db, const QuantizedInput& xq = {});
  // exact: keep the per-pair kernels whatever the pass size (decode steps, so that a sequence's
  // tokens do not depend on how many others share its batch).
  // xq: the codes of the normed rows sc.x (empty: quantised here).
  // defer_combine: when the layer's combine can run inside the MoE site's expand (FP4 banks), it is
  // left to the caller (HcExpandArgs::routed) and moe returns true; sc.y is then not written.
  bool moe(const GpuBlock& b, int64_t n, bool exact = false, const QuantizedInput& xq = {}, bool defer_combine = false);
  void attn_output(const GpuBlock& b, int64_t n);  // sc.o -> sc.y (grouped wo_a, wo_b)
  void head_logits(const float* x, int64_t rows, float* y);  // fp32 logits of normed rows
  void engram(const GpuBlock& b, const uint8_t* raw_rows, int64_t n);  // raw_rows: engram_layer_rows
  // y[m][y_stride] = lin(x[m][x_stride]) (bf16-rounded when `round`). An FP8/FP4 linear reads the
  // codes xq of x when given (rows >= m, k = l.in), else quantises x into sc.codes first.
  void linear(const GpuLinear& l, const float* x, int64_t x_stride, int64_t m, float* y, int64_t y_stride,
              bool round, const QuantizedInput& xq = {});
  // Two linears of the same rows x: y1 = l1(x), y2 = l2(x). When both are FP8 (or both FP4) with
  // the same input width they run as one grouped launch (the input quantised once), bit-identical to
  // two linear() calls; any other mix of kinds runs them one after the other.
  void linear_pair(const GpuLinear& l1, float* y1, int64_t y1_stride, const GpuLinear& l2, float* y2,
                   int64_t y2_stride, const float* x, int64_t x_stride, int64_t m, bool round,
                   const QuantizedInput& xq = {});
  static bool takes_codes(const GpuLinear& l) {
    return l.kind == GpuLinear::Kind::Fp8 || l.kind == GpuLinear::Kind::Fp4;
  }
  // ActQuant8 of m rows x[m][x_stride] of width k into codes/scales (one launch).
  QuantizedInput quantize(const float* x, int64_t x_stride, int64_t m, int64_t k, uint8_t* codes, float* scales);
  // RMSNorm `a`; with want_codes (and a.d % 32 == 0) the same kernel writes the codes of its output
  // rows into codes/scales and they are returned, else the result is empty.
  QuantizedInput rms_norm_rows(ops::gpu::RmsNormArgs a, bool want_codes, uint8_t* codes, float* scales);
  // The collapse `c` and then rms_norm_rows(a, ...) in place on its output rows, as one op
  // (gpu::hc_collapse_rms_norm: one launch at decode sizes).
  QuantizedInput collapse_norm_rows(const ops::gpu::HcCollapseArgs& c, ops::gpu::RmsNormArgs a, bool want_codes,
                                    uint8_t* codes, float* scales);
};

}  // namespace dsv41::model::cuda
#endif
