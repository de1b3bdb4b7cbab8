// The CUDA model backend: the text forward pass on one GPU, for the FP8/FP4/BF16 release checkpoint
// and for EXL3 checkpoints, composed from the validated ops of include/dsv41/ops/gpu_ops.h (and the
// EXL3 kernels of dsv41/ops/exl3_gpu.h) in exactly the CPU reference engine's order (src/model/*.cpp
// is the truth; every numeric choice there is mirrored here, EXL3 as closely as its kernels allow).
//
//  - Weights are uploaded once at load; routed experts become one FP4 bank per layer, or stay one
//    EXL3 linear each for the grouped MoE kernels (EXL3 linears: src/cuda_model/cuda_exl3.cpp).
//  - A sequence's state lives on the GPU (bf16 window rings, compressed KV and index keys per KV
//    source, fp32 compressor carries): heap states are sized for `max_context` tokens, pooled ones
//    (the server's state pool over state_memory()) grow by room in pool blocks; the Engram n-gram
//    history stays on the host and the Engram table rows come from the host EngramStore.
//  - One scratch arena is allocated at load for `max_chunk_tokens` tokens: a forward allocates no
//    device memory. Longer chunks run as several passes that keep the chunk's index-list layout,
//    so results do not depend on the pass size.
//  - Chunking follows CpuModel: a one-token step at or beyond SeqState::prompt_len is a decode step
//    (ring-order window list, the decode-time index-key alias unless corrected_index_keys).
//  - The indexer's candidate-block and top-k selections run on the host over the device's scores
//    (one download per index layer and pass): the CPU engine's tie order among exactly equal
//    scores (torch_topk_indices) decides which entries are attended.
//  - DSpark: the mtp.* drafter runs on the device (batched over sequences); save_step / undo_step
//    roll a sequence back after speculative verification (src/spec/cuda_backend.cpp).
//  - Tensor parallelism (CudaModelOptions::tp, src/cuda_model/cuda_tp.cpp): a rank holds whole
//    attention output groups (wq_b rows, sinks, wo_a groups), column slices of wo_b and the shared
//    expert, a contiguous routed-expert id range and a vocabulary slice of the head; each split
//    output is computed whole (full-K dot products, as at TP 1) into a zeroed buffer and the ranks
//    all-reduce it, so every value is the TP 1 value plus exact zeros. Engram, the mHC, norms,
//    routers, compressors and indexers are replicated. EXL3 checkpoints split the same parts at
//    128-column blocks, a rank's experts in the grouped kernels as partial sums or expert by
//    expert (not bit-equal to TP 1: a sliced matrix has its own k-split plan, and the partials are
//    rounded; docs/TENSOR_PARALLEL.md). Not split yet: DSpark.
//  - One-token decode steps of several sequences in one forward(batch) call run as one pass; CUDA graphs of
//    decode steps are optional (cuda_graphs below).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv41/engram/open.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/model.h"

namespace dsv41::dist {
class Collective;
}

namespace dsv41::model {

// The indexer's score rows of a pass (tokens x score columns, fp32) are scored, downloaded and
// selected in row slices of at most this many bytes (at least one row), so that neither the device
// buffer nor its pinned host copy grows with tokens per pass x context (CudaModelOptions).
inline constexpr int64_t kIndexScoreSliceBytes = int64_t{64} << 20;

// How the scratch holds index scores for passes of up to `m` rows of up to `t_max` columns with
// slices of `slice_bytes`: `rows` full-width rows per slice buffer, and 1 buffer when a whole pass
// fits in it, else 2 (the GPU scores the next slice into one while the host selects from the
// other). The same numbers size the arena (cuda_load.cpp) and the start-up budget (serve_startup).
struct IndexScoreSlicing {
  int64_t rows = 1, buffers = 1, t_max = 1;
  int64_t slice_floats() const { return rows * t_max; }
  int64_t floats() const { return buffers * rows * t_max; }
};
inline IndexScoreSlicing index_score_slicing(int64_t m, int64_t t_max, int64_t slice_bytes) {
  IndexScoreSlicing s;
  s.t_max = t_max < 1 ? 1 : t_max;
  const int64_t fit = slice_bytes / (s.t_max * 4);
  s.rows = fit < 1 ? 1 : (fit < m ? fit : (m < 1 ? 1 : m));
  s.buffers = s.rows < m ? 2 : 1;
  return s;
}

struct CudaModelOptions {
  // Engram (as CpuModelOptions): the token map file and where table rows come from.
  std::string engram_token_map;
  engram::EngramStorageOptions engram_storage;
  std::shared_ptr<engram::EngramStore> engram_store;
  bool corrected_index_keys = false;  // see CpuModelOptions
  int64_t mix_gemm_k_parts = -2;      // see CpuModelOptions (prefill mixes GEMM K order; -2 = auto)
  int device = 0;                     // CUDA device ordinal
  // Context tokens a sequence state holds; 0 = min(max_position_embeddings, 32768).
  int64_t max_context = 0;
  // Tokens per forward pass (sizes the scratch arena: ~0.5 MB per token at the released dimensions,
  // whatever the context, since the index score rows are sliced (index_score_slice_bytes) and the
  // attention, MoE, Engram and head buffers share memory: dsv41/model/cuda_scratch_plan.h). Larger
  // passes read each routed expert once for more tokens: prefill's grouped expert GEMM is bound by
  // those weight reads at a few rows per expert (bench/RESULTS.md). 2048: 1.11 GiB of arena at
  // the serve default context (1M) + 0.2 GiB DSpark scratch, inside the 2 GiB engine overhead
  // (1024 takes 0.62 + 0.1 GiB). Results do not depend on it with exact_block_sums; without,
  // a pass below the tensor-core thresholds (64 rows of a Lin8, grouped_moe_min_rows pairs) takes
  // the sequential block sums, so a row whose block sum rounds (tc_block.cuh) can differ in its
  // last bits between pass sizes.
  int64_t max_chunk_tokens = 2048;
  // Rows of logits the scratch holds (a vocabulary row is 0.5 MB at the released size): a pass that
  // returns every row's logits, a batched decode step and a DSpark drafter pass take at most this
  // many rows, so longer prefill passes do not grow the logits buffer. Results do not depend on it.
  int64_t max_logit_rows = 256;
  // Bytes of one slice of index score rows (kIndexScoreSliceBytes; at least one row is taken
  // whatever it says): bounds the device score buffers and their pinned host copies. Results do not
  // depend on it (each row's selection reads that row's scores only).
  int64_t index_score_slice_bytes = kIndexScoreSliceBytes;
  // Passes with at least this many (token, slot) pairs run the routed FP4 experts as grouped
  // tensor-core GEMMs (gpu::moe_grouped): ~3x faster at 256-token prefill passes, ~9x at 2048, but
  // not guaranteed bit-identical to the CPU engine (the tensor core sums each 32-wide block of exact
  // products in its own order); fewer pairs, or 0, keep the exact per-pair kernels. Decode steps
  // (batched or not) and DSpark drafts always keep them, so a sequence's tokens never depend on its
  // batch. exact_block_sums turns it off too.
  int64_t grouped_moe_min_rows = 64;
  // EXL3 checkpoints: passes of at least this many tokens run each routed expert once over all the
  // rows that picked it (the CPU engine's own form, in grouped EXL3 GEMMs);
  // shorter passes and decode steps take the grouped MoE kernels, 8 tokens per call, each call
  // reading every expert its tokens picked. 0: never. (Like every EXL3 path, results follow the
  // kernels' row counts: cuda_exl3.cpp.)
  int64_t exl3_by_expert_min_tokens = 256;
  // true: every FP8/FP4 linear sums each 32-wide block of exact code products one by one in K order,
  // as the CPU engine does, so results are bit-identical to it (and the grouped MoE above is off).
  // false lets prefill passes sum a block in the tensor core (the Lin8 GEMM from 64 rows, the
  // grouped MoE): the same value unless the block's sum rounds in either order, otherwise within
  // ~2^-18 of the block's magnitude (kernels/ops/tc_block.cuh; docs/ARCHITECTURE.md, Numerics).
  // Decode steps and DSpark drafts keep the sequential sums either way. Tests that compare with the
  // CPU engine bit for bit set true; the environment's DSV41_EXACT_BLOCK_SUMS=1 sets it in every
  // process of a run.
  bool exact_block_sums = false;
  // Load the mtp.* DSpark stages when the config has them (drafting, and the DSpark rings every
  // forward feeds); as CpuModelOptions::dspark.
  bool dspark = true;
  // Decode steps (solo and batched) run as CUDA graphs captured per batch size and segment between
  // host points (src/cuda_model/cuda_graph.h). Off by default: each step is captured again and the
  // executable updated, which costs more host time (~0.9 ms per step) than the graph launch saves
  // over eager PDL launches (bench/RESULTS.md); replaying a graph unchanged needs the kernels to
  // read the per-step values (positions, list lengths, ring slots) from device memory. The
  // environment's DSV41_CUDA_GRAPHS=1 turns it on, DSV41_NO_GRAPHS=1 off, whatever this says.
  // Never under tensor parallelism (its collectives run eagerly).
  bool cuda_graphs = false;
  // Index top-k (and candidate blocks) on the host even where the device selection applies (the
  // same selection either way; A/B runs and tests). DSV41_HOST_INDEX_TOPK=1 sets it too.
  bool host_index_topk = false;
  // Tensor parallelism: this rank's collective over device memory (the NCCL backend); null = TP 1.
  // Every rank loads its share and all ranks must run the same forwards in the same order.
  std::shared_ptr<dist::Collective> tp;
};

// Device memory the model holds, in bytes (printed at load).
struct CudaMemoryBreakdown {
  int64_t weights = 0;
  int64_t state_per_sequence = 0;  // one sequence state of max_context tokens
  int64_t scratch = 0;
  // `weights` by storage format: FP8 block-scaled linears, FP4 experts, EXL3 linears, and the rest
  // (BF16/F16/F32 matrices, embeddings, norms, mHC and router parameters).
  int64_t weights_fp8 = 0, weights_fp4 = 0, weights_exl3 = 0, weights_dense = 0;
  // Part of `scratch`: the raw Engram rows of every Engram layer for one pass, staged before it.
  int64_t engram_staging = 0;
  // Page-locked host memory (not device memory): Engram row staging, index scores, top-k selections.
  int64_t pinned_host = 0;
};

// Decode steps in CUDA graphs (CudaModel::graph_stats): counters and host time since load.
struct CudaGraphStats {
  int64_t steps = 0;           // decode steps that ran in graphs
  int64_t graph_launches = 0;  // segment graphs launched
  int64_t updates = 0;         // executables refreshed in place (cudaGraphExecUpdate)
  int64_t instantiations = 0;  // executables built (a new bucket, segment or topology)
  double capture_ms = 0;       // host time inside captures (issuing the captured work)
  double update_ms = 0, instantiate_ms = 0, launch_ms = 0;  // host time of those calls
};

// Which form some ops took since load (CudaModel::path_stats), so that a test can check that the
// path it targets ran.
struct CudaPathStats {
  int64_t exl3_moe_grouped_calls = 0;  // grouped EXL3 MoE kernel calls (up to 8 tokens each)
  int64_t exl3_moe_by_expert = 0;      // EXL3 MoE layer runs expert by expert (large passes)
};

// One saved step of a sequence state (CudaModel::save_step / undo_step); move-only, reusable.
class CudaStepUndo {
 public:
  CudaStepUndo();
  ~CudaStepUndo();
  CudaStepUndo(CudaStepUndo&&) noexcept;
  CudaStepUndo& operator=(CudaStepUndo&&) noexcept;
  struct Data;

 private:
  friend class CudaModel;
  std::unique_ptr<Data> d_;
};

namespace cuda {
struct Impl;
}

class CudaModel final : public Model {
 public:
  // Throws dsv41::Error for a checkpoint this backend cannot run (names the tensor/format) and
  // when the build has no CUDA.
  static std::unique_ptr<CudaModel> load(const std::string& dir, const CudaModelOptions& opts);
  ~CudaModel() override;

  const ModelConfig& config() const override;
  std::unique_ptr<SeqState> new_sequence() const override;
  // Pooled states (the server's StatePool): device buffers carved from blocks of `memory`, whose
  // upstream must be state_memory() (device memory of this model, ordered on its stream).
  // Room is at most max_context() tokens.
  std::unique_ptr<SeqState> new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const override;
  void reserve_sequence(SeqState& state, int64_t capacity_tokens) const override;
  int64_t state_bytes(int64_t capacity_tokens) const override;
  std::pmr::memory_resource& state_memory() const override;
  void forward(std::span<ForwardItem> batch) override;

  // One sequence, as CpuModel::forward_sequence (dump: streams after every block, downloaded).
  void forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                        std::vector<float>* logits, BlockDump* dump = nullptr);
  // ---- DSpark drafting and speculative verification (src/cuda_model/cuda_spec_api.cpp) ----
  bool has_dspark() const;
  // As CpuModel::dspark_draft: the draft block after the state's last processed position, with
  // `anchor` (the token for position n_past); reads the state's DSpark rings, modifies nothing.
  DsparkDraft dspark_draft(const SeqState& state, int32_t anchor);
  // The same for several sequences in one drafter pass (per max_chunk_tokens / block sequences).
  std::vector<DsparkDraft> dspark_draft_batch(std::span<const SeqState* const> states, std::span<const int32_t> anchors);
  // Saves what a one-token step at the state's position n_past overwrites (window-ring and DSpark
  // ring slots, compressor carries, entry counts, index-key publisher, Engram history, n_past), on
  // the device; `into` keeps its buffers for reuse. undo_step restores it: steps saved in order
  // and undone in reverse order return the state exactly to before the first of them.
  void save_step(const SeqState& state, CudaStepUndo& into);
  void undo_step(SeqState& state, const CudaStepUndo& saved);
  CudaMemoryBreakdown memory() const;
  // Decode steps in CUDA graphs (on when loaded with CudaModelOptions::cuda_graphs, no
  // DSV41_NO_GRAPHS=1 and no tensor parallelism; turning it on otherwise is refused).
  void set_cuda_graphs(bool on);
  bool cuda_graphs() const;
  bool cuda_graphs_available() const;  // false under tensor parallelism
  // What the decode graphs did so far (all zero when they never ran).
  CudaGraphStats graph_stats() const;
  // Benchmark only: time each layer of the following passes with events at the layer boundaries
  // (a decode step in CUDA graphs then runs as one graph segment per layer, as without timing).
  // layer_times_ms: the last pass's milliseconds per layer, empty when none was timed.
  void set_layer_timing(bool on);
  std::vector<double> layer_times_ms();
  CudaPathStats path_stats() const;
  int64_t max_context() const;
  // Benchmark only (`dsv41-serve bench`, src/cuda_model/cuda_bench_fill.cpp): makes `state` (from
  // new_sequence()) look as if it had processed n_past tokens, with random values of the stored
  // types in its rings, compressed KV, index keys and carries; the next one-token step is a decode
  // step. Its outputs are meaningless; its timing is that of a real state of n_past tokens.
  void bench_fill_state(SeqState& state, int64_t n_past, uint64_t seed) const;

  struct Impl;

 private:
  explicit CudaModel(std::unique_ptr<Impl> impl);
  cuda::Impl& engine() const;  // the backend's internals (cuda_model.cpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41::model
