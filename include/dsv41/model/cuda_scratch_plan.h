// The layout of the CUDA model's scratch arena (src/cuda_model/cuda_load.cpp alloc_scratch): which
// buffers a pass of `m` tokens uses, their bytes, and where each lies. Arithmetic on the config
// only (no GPU), so the start-up budget (src/runtime/serve_startup.cpp cuda_scratch_bytes) reads
// the same numbers the model allocates.
//
// The forward runs on one stream, and within a layer the GPU runs its phases one after another:
// the Engram sublayer, the attention sublayer, the MoE sublayer (each ending in the expand that
// folds its output into the streams), and after the last layer the head. A buffer written and
// read within one phase is dead once the phase's last kernel has run, so the phases' buffers share
// one region: the arena is the common pieces (read across phases or layers) followed by the
// largest phase. Stream order keeps a phase's kernels after the previous phase's (with programmatic
// dependent launch too: a kernel waits for its predecessor before it touches memory a kernel
// writes, kernels/ops/pdl.cuh); nothing outside the stream reads the arena (the host reads the
// index scores and writes the top-k through pinned copies, Impl::scores_host / topk_host, with
// copies in stream order; tensor-parallel all-reduces run on the same stream).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "dsv41/config/model_config.h"
#include "dsv41/model/cuda_model.h"

namespace dsv41::model {

enum class ScratchPhase { kCommon, kAttention, kMoe, kEngram, kHead };
inline constexpr int kScratchPhases = 5;

// One buffer of the arena, named as its Scratch field (src/cuda_model/cuda_impl.h); kSg holds sg
// and su back to back.
enum class ScratchPiece {
  kH, kPre, kX, kY, kMixA, kMixF, kCodes, kActScales, kXCodes, kXScales, kTokens, kSlots, kEngramRaw,
  kPositions, kMixCounters, kBatchPools, kTopk, kCandKeep, kRows16,
  kQr, kQ, kKv, kO, kZ, kKvBf16, kStaged, kQrCodes, kQrScales, kCA, kCG, kCLatent, kCWork, kQi, kIw,
  kScores, kScoreIdx, kBlockScores, kBlockIdx, kBlockSel, kList, kPoolA, kPoolB,
  kIds, kRouteW, kRouteScratch, kEg, kEu, kRouted, kSg, kShared, kMoeSort, kExl3Rows,
  kEngramRows, kEngramKv,
  kLogits,
  kCount
};
inline constexpr int kScratchPieces = static_cast<int>(ScratchPiece::kCount);

struct ScratchPlanPiece {
  ScratchPiece id;
  ScratchPhase phase;
  int64_t bytes = 0;   // as the buffer needs them
  int64_t offset = 0;  // from the arena's start, a multiple of kScratchAlign
};

// What the arena is sized for besides the config (CudaModelOptions and the load).
struct ScratchPlanInputs {
  int64_t tokens = 1;       // tokens per pass (CudaModelOptions::max_chunk_tokens)
  int64_t max_context = 1;  // score columns: max_context / the smallest compress ratio
  int64_t logit_rows = 256;  // CudaModelOptions::max_logit_rows
  int64_t score_slice_bytes = kIndexScoreSliceBytes;
  bool tensor_parallel = false;  // a split MoE keeps one more row set after the routed rows (cuda_tp.cpp)
};

inline constexpr int64_t kScratchAlign = 256;
// Candidate masks made on the device cover candidate sources of up to this many score columns
// (128k context at ratio 1), or 64·index_topk - 1 if more; wider sources select on the host (so
// do the layers after them, whose wider rows a 64 MiB score slice holds fewer than
// Impl::kDeviceHeapRows of). The masks take a bit per block and row (m·ceil(blocks / 32) words).
inline constexpr int64_t kDeviceCandidateColumns = 131072;

struct ScratchPlan {
  int64_t m = 0, t_max = 1, logit_rows = 0;
  // Candidate blocks on the device (gpu::candidate_blocks): blocks of the widest source row the
  // device selection takes, the block top-k, and rows per block-scratch slice.
  int64_t cand_blocks = 1, cand_topk = 1, cand_rows = 1;
  IndexScoreSlicing slicing;
  int64_t moe_sort_ints = 0;        // ints of the grouped MoE's bucketing (moe_grouped_sort_ints)
  int64_t engram_raw_bytes = 0;     // raw Engram rows of every Engram layer for one pass
  int64_t rows16_in = 0;            // widest Lin8 input the f16 row scratch holds (0: none)
  int64_t rows16_bytes = 0;         // that scratch: lin8_rows16_bytes(m, rows16_in)
  std::vector<ScratchPlanPiece> pieces;  // indexed by ScratchPiece
  std::array<int64_t, kScratchPhases> phase_bytes{};  // aligned bytes of each phase's pieces
  int64_t total = 0;     // the arena: common + the largest other phase
  int64_t unshared = 0;  // what the pieces would take side by side
  const ScratchPlanPiece& at(ScratchPiece p) const { return pieces[static_cast<size_t>(p)]; }
};

// The scratch piece of an EXL3 MoE pass expert by expert (cuda_exl3.cpp moe_exl3_by_expert): the
// pairs' rows sorted by expert as fp16 x_had, first of the gate and up projections
// ([2][pairs][k of hidden]), then of the down projection ([pairs][k of inter]; k padded to 128),
// then the host-built index: per sorted row its token, routing weight, pair and expert, then the
// grouped GEMMs' tiles (at most `max_tiles`, 4 ints each).
struct Exl3SortLayout {
  int64_t pairs = 0;
  int64_t xh_bytes = 0;   // the index starts here (256-byte aligned)
  int64_t max_tiles = 0;  // gate and up: 2 per (expert, 64 rows); down: 1
  int64_t index_ints() const { return 4 * pairs + 4 * max_tiles; }
  int64_t bytes() const { return xh_bytes + index_ints() * 4; }
};
Exl3SortLayout exl3_sort_layout(int64_t pairs, int64_t hidden, int64_t inter, int64_t experts);

// Throws dsv41::Error unless tokens, context, logit rows and slice bytes are positive.
ScratchPlan plan_cuda_scratch(const ModelConfig& c, const ScratchPlanInputs& in);

const char* scratch_phase_name(ScratchPhase p);

}  // namespace dsv41::model
