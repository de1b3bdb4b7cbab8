// Argument structs and raw launchers of the non-EXL3 op kernels (kernels/ops/*.cu). The launchers
// trust their arguments; the validated entry points are in include/dsv41/ops/gpu_ops.h.
//
// Conventions: activations are fp32 arrays holding the reference's values (bf16-rounded where the
// reference rounds); KV cache rows and index keys are stored as bf16 bits (uint16_t); FP8 codes and
// E8M0 scales stay bytes. All pointers are device memory unless a comment says otherwise; every
// launch is asynchronous on `stream` and allocates nothing (graph-capturable).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41::ops::gpu {

// ---- norms, rotary, quantise-dequantise ------------------------------------------------------
// RoPE (forward) of the last rope_dim columns of each row of k columns, applied inside the kernel
// that writes the rows (freqs == nullptr: none). Row r belongs to token r / row_div, whose
// position is positions[token], or pos0 + token*pos_step without positions (as RopeArgs).
struct RopeTail {
  const float* freqs = nullptr;  // [rope_dim/2]
  int64_t rope_dim = 0;
  const int64_t* positions = nullptr;
  int64_t pos0 = 0, pos_step = 1, row_div = 1;
};
struct RmsNormArgs {
  const float* x = nullptr;  // [rows][x_stride]
  int64_t x_stride = 0;
  const float* w = nullptr;  // [d]
  float* out = nullptr;      // [rows][out_stride]; may alias x
  int64_t out_stride = 0;
  int64_t rows = 0, d = 0;
  float eps = 0.0f;
  // Optional (both or neither; d % 32 == 0): ActQuant8 of the output rows written by the same
  // kernel, codes [rows][d] e4m3 bytes and scales [rows][d/32], as act_quant8 of `out` would write.
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  // Optional, for rows that RoPE and QDQ8 follow (the attention's kv rows; needs d % 32 == 0):
  // after its bf16 rounding each output goes through rope (the tail, RopeTail) and then QDQ8
  // (qdq8), exactly as separate rope and qdq launches over `out` would; codes then quantise that.
  RopeTail rope{};
  bool qdq8 = false;
  // Optional: the final output rows also as bf16 bits (store_bf16 of `out`) at bf16_out + r*bf16_stride.
  uint16_t* bf16_out = nullptr;
  int64_t bf16_stride = 0;
};

struct RopeArgs {
  float* v = nullptr;             // first rotated value of vector (r, h) at v + r*row_stride + h*vec_stride
  int64_t rows = 0, vecs = 1, vec_stride = 0, row_stride = 0;
  const float* freqs = nullptr;   // [rope_dim/2] fp32 frequencies (RopeTable::freqs)
  int64_t rope_dim = 0;
  const int64_t* positions = nullptr;  // [rows]; nullptr: position of row r is pos0 + r*pos_step
  int64_t pos0 = 0, pos_step = 1;
  bool inverse = false;
};

enum class QdqKind : int { Q8 = 0, Q4a = 1, Q4b = 2 };
struct QdqArgs {
  float* x = nullptr;  // [rows][stride], first k values of each row, in place
  int64_t rows = 0, k = 0, stride = 0;
  QdqKind kind = QdqKind::Q8;
  RopeTail rope{};  // optional: RoPE of the rows' last rope_dim of k values before the QDQ
};

struct ActQuantArgs {
  const float* x = nullptr;  // [rows][x_stride]
  int64_t rows = 0, k = 0, x_stride = 0;
  uint8_t* codes = nullptr;  // [rows][k] e4m3 bytes
  float* scales = nullptr;   // [rows][k/32] power-of-two scales
};

// ---- linears -----------------------------------------------------------------------------------
struct Fp8Weight {
  const uint8_t* codes = nullptr;   // [out][in] e4m3
  const uint8_t* scales = nullptr;  // [ceil(out/32)][ceil(in/32)] E8M0
  int64_t in = 0, out = 0;
};
// A bank of FP4 experts stored back to back: packed [E][out][in/2] (low nibble = even column),
// scales [E][out][in/32] E8M0. A plain Lin4 is a bank of one.
struct Fp4Weight {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  int64_t in = 0, out = 0, n_experts = 1;
};
struct Lin8Args {
  Fp8Weight w;
  const uint8_t* x_codes = nullptr;  // ActQuant8 of the m input rows
  const float* x_scales = nullptr;
  int64_t m = 0;
  float* y = nullptr;  // [m][y_stride]
  int64_t y_stride = 0;
  bool round_bf16 = true;
  // true: every 32-wide block's products are summed one by one in K order, as the CPU engine does
  // (bit-identical always). false lets a kernel sum a block's exact products in the tensor core:
  // the same value unless the block's sum rounds in either order (kernels/ops/tc_block.cuh).
  bool exact_block_sums = false;
  // true: the call belongs to a pass whose rows must not depend on each other (decode steps, DSpark
  // drafts: batching never changes a token). Such a call takes, without exact_block_sums and with
  // the kernel on (the default), the decode-size tensor-core kernel where it
  // applies (kernels/ops/lin8_tc_gemv.h: every row's bits a function of the weights and the row
  // alone, at any m), else the sequential sums; never the prefill GEMMs' tensor-core path.
  bool row_invariant = false;
  // Optional scratch for the tensor-core GEMM's scaled path (lin8_rows16_bytes(m, in) bytes or more,
  // 16-byte aligned, apart from every other buffer; a group reads linear 0's): the input rows in f16
  // with their block scales folded in (ops/scaled_rows.h). Null or too small: the codes path.
  void* rows16 = nullptr;
  int64_t rows16_bytes = 0;
  // The scaled path's numerics. true: blocks folded one by one (the codes path's bits). false (the
  // default): every finite row becomes f16 (ScaledRowsArgs::round_wide) and a 32-row weight group
  // whose block scales lie within 2^21 of each other sums the whole K in the MMAs, its block
  // scales inside the widened weights (kernels/ops/lin8_tc_gemm.cu); within the bound of
  // tests/gpu_ops/lin8_tc_gemm_test.cpp, and a row's bits depend on no other row, except that a row
  // with a non-finite activation (no f16 form) sends its token tile to the codes path.
  bool block_fold = false;
};
// Bytes of Lin8Args::rows16 for m rows of `in` codes: the f16 rows, 16-byte aligned, then an int32
// row exponent per row.
constexpr int64_t lin8_rows16_info_offset(int64_t m, int64_t in) { return (m * in * 2 + 15) / 16 * 16; }
constexpr int64_t lin8_rows16_bytes(int64_t m, int64_t in) { return lin8_rows16_info_offset(m, in) + m * 4; }
// Row r of y = Lin4(expert expert_ids[r], input row r / x_row_div): x_row_div = top_k runs the
// gate/up projections of every (token, slot) pair, 1 the down projection of the pair rows.
// expert_ids nullptr = expert 0 for every row; an id < 0 writes zeros.
struct Lin4Args {
  Fp4Weight w;
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  int64_t rows = 0;
  const int32_t* expert_ids = nullptr;
  int64_t x_row_div = 1;
  float* y = nullptr;  // [rows][y_stride]
  int64_t y_stride = 0;
  bool round_bf16 = true;
};
// Up to kLinGroupMax Lin8s (Lin4 banks) that read the same input codes, in one launch: the warp
// tiles are dealt over the linears' outputs as if they were concatenated, and every output equals
// its separate lin8 / lin4 call bit for bit. lin[0..count) share w.in, x_codes, x_scales, m (rows),
// round_bf16 (Lin8s also exact_block_sums); Lin4 banks also n_experts, expert_ids and x_row_div.
constexpr int kLinGroupMax = 3;
struct Lin8GroupArgs {
  Lin8Args lin[kLinGroupMax];
  int count = 0;
};
struct Lin4GroupArgs {
  Lin4Args lin[kLinGroupMax];
  int count = 0;
};
// Dense linear over bf16 (LinBF16), fp16 (an EXL3 checkpoint's unquantized linears) or fp32
// (LinF32) weights, in `groups` independent groups: group g uses weight rows [g*out, (g+1)*out),
// input columns [g*in, ..) and output columns [g*out, ..) (the grouped low-rank output); groups = 1
// is a plain linear. The weights are widened to fp32 exactly, so the type changes bytes, not sums.
enum class DenseType : int { BF16 = 0, F32 = 1, F16 = 2 };
struct DenseArgs {
  const void* w = nullptr;  // [groups*out][in] bf16 bits, fp16 bits or fp32
  DenseType wt = DenseType::BF16;
  int64_t in = 0, out = 0, groups = 1;
  const float* x = nullptr;  // [m][x_stride]
  int64_t x_stride = 0, m = 0;
  float* y = nullptr;  // [m][y_stride]
  int64_t y_stride = 0;
  bool round_bf16 = true;
  // Prefill passes: bf16 weights may run on the tensor cores, products exact, their sum in the
  // tensor core's order (kernels/ops/dense_tc_gemm.cu); false: the CPU's order, bit for bit.
  bool tensor_core = false;
};

// ---- mHC ----------------------------------------------------------------------------------------
// mix row layout per token: pre[hc], post[hc], comb[hc*hc] (comb[j*hc+k]: input j, output k).
inline constexpr int64_t kMaxMixParts = 256;  // K parts of one mixes dot (HcMixArgs::k_parts)
struct HcMixArgs {
  const float* h = nullptr;  // [n][hc][dim]
  int64_t n = 0, hc = 0, dim = 0;
  const float* fn = nullptr;     // [(2+hc)*hc][hc*dim] fp32
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]
  int64_t iters = 0;
  float hc_eps = 0.0f, norm_eps = 0.0f;
  float* mix = nullptr;  // [n][(2+hc)*hc]
  // torch.sigmoid's path per pre/post element (src/model/ops/mhc.h HcMixArithmetic): token t is row
  // t_ref0 + t of a reference call over rows_ref tokens; its first clamp(floor(rows_ref*hc/16)*16 -
  // (t_ref0+t)*hc, 0, hc) elements take the vectorised exp, the rest libm's. rows_ref < 0: every
  // element vectorised (the CPU's hc_mix without an arithmetic argument).
  int64_t t_ref0 = 0, rows_ref = -1;
  // K order of the mixes GEMM (HcMixArithmetic::k_parts, dsv41/model/mix_gemm_parts.h): 0 = fma
  // chains of 256 added in K order; -1 = the BLAS's blocked order (chains of 384, the rest
  // halved); P in 1..32 = P parts of whole 64-element units (the first K/64 mod P one unit longer),
  // each one fma chain, added in order. At most kMaxMixParts parts.
  int64_t k_parts = 0;
  // Optional [n] zeroed counters, left zeroed (graph-safe): with them, when the mix dots take the
  // staged kernel, hc <= 5 and n <= 64 (decode), the last block to finish a token runs its Sinkhorn
  // split in the same launch (one launch in place of two; the same arithmetic).
  unsigned* counters = nullptr;
  // true: only the dots (a.mix gets the raw scaled mixes, no Sinkhorn split); for op tests of the
  // dots' exact order.
  bool raw_dots = false;
};
struct HcCollapseArgs {
  const float* h = nullptr;  // [n][hc][dim]
  const float* w = nullptr;  // weights of token t at w + t*w_stride (hc values)
  int64_t w_stride = 0;
  int64_t n = 0, hc = 0, dim = 0;
  float* out = nullptr;  // [n][dim]
};
struct HcExpandArgs {
  const float* y = nullptr;  // [n][dim]
  float* h = nullptr;        // [n][hc][dim], in place
  const float* mix = nullptr;
  int64_t n = 0, hc = 0, dim = 0;
  // Optional, the MoE site's expand (one launch in place of moe_combine, hc_expand and the pre copy):
  // with routed set, y is not read but made here as moe_combine of (routed, ids, top_k, shared)
  // makes it (written to y_out when set); with pre_out set, token t's first hc mix values (the next
  // site's pre weights) go to pre_out + t*hc.
  const float* routed = nullptr;  // [n*top_k][dim]
  const int32_t* ids = nullptr;   // [n][top_k]
  int64_t top_k = 0;
  const float* shared = nullptr;  // [n][dim]
  float* y_out = nullptr;         // [n][dim]
  float* pre_out = nullptr;       // [n][hc]
};

// ---- MoE -----------------------------------------------------------------------------------------
enum class Scoring : int { SqrtSoftplus = 0, Sigmoid = 1 };
struct RouterArgs {
  const float* x = nullptr;  // [n][dim]
  int64_t n = 0, dim = 0;
  const float* gate_w = nullptr;     // [E][dim] fp32
  const float* gate_bias = nullptr;  // [E] (selection only)
  int64_t n_experts = 0, top_k = 0;
  Scoring scoring = Scoring::SqrtSoftplus;
  float temp = 1.0f;
  bool norm_topk = true;
  float route_scale = 1.0f;
  int32_t* ids = nullptr;  // [n][top_k] in selection order (largest biased score first)
  float* weights = nullptr;  // [n][top_k]
  float* scratch = nullptr;  // [n][2*E]: scores, biased scores
};
struct SwigluArgs {
  const float* g = nullptr;  // [rows][inter] (bf16 values)
  const float* u = nullptr;
  int64_t rows = 0, inter = 0;
  const float* row_weight = nullptr;  // [rows] routing weights, nullptr for the shared expert
  float limit = 0.0f;                 // <= 0: no clamp
  float* out = nullptr;               // [rows][inter] bf16 values; may alias g
  // Optional (both or neither; inter % 32 == 0): ActQuant8 of the output rows written by the same
  // kernel, codes [rows][inter] and scales [rows][inter/32] (the down projection's input).
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};
struct MoeCombineArgs {
  const float* routed = nullptr;  // [n*top_k][dim] expert outputs (bf16 values), pair order
  const int32_t* ids = nullptr;   // [n][top_k]
  int64_t n = 0, top_k = 0, dim = 0;
  const float* shared = nullptr;  // [n][dim]
  float* out = nullptr;           // [n][dim]
};

// ---- Engram --------------------------------------------------------------------------------------
struct EngramDequantArgs {
  const uint8_t* rows = nullptr;  // staged table rows [slots][row_bytes]: head_dim e4m3 + scales
  int64_t row_bytes = 0;
  const int32_t* slots = nullptr;  // [n_out] row slot of each output row
  int64_t n_out = 0, head_dim = 0;
  float* out = nullptr;  // [n_out][head_dim]
};
struct EngramGateArgs {
  float* h = nullptr;          // [n][hc][dim], in place
  const float* kv = nullptr;   // [n][(hc+1)*dim]: keys of the hc streams, then the value
  const float* gate_w = nullptr;  // [hc][dim]
  int64_t n = 0, hc = 0, dim = 0;
  float eps = 0.0f, inv_sqrt_dim = 0.0f;
};

// ---- indexer, top-k, candidates ----------------------------------------------------------------------
struct IndexerArgs {
  const float* qi = nullptr;     // [n][heads][head_dim] (QDQ4a values)
  const float* w = nullptr;      // [n][heads] (bf16 values, already scaled)
  const uint16_t* keys = nullptr;  // [n_keys][head_dim] bf16
  int64_t n_keys = 0;
  int64_t n = 0, heads = 0, head_dim = 0;
  int64_t T = 0, start = 0, ratio = 1;  // query t sees entries < (start+t+1)/ratio
  float* scores = nullptr;  // [n][T]
};
// The k selected entries of each row, ascending; with ratio > 0 an index >= (pos0+r+1)/ratio
// becomes -1 (the indexer's visibility rule).
struct TopkArgs {
  const float* values = nullptr;  // [rows][stride]
  int64_t rows = 0, n = 0, stride = 0, k = 0;
  int64_t pos0 = 0, ratio = 0;
  int32_t* out = nullptr;  // [rows][k]
};
// The reference's selection with its tie order (kernels/ops/topk_replay.cu): the same k entries
// as model::topk_sorted, in both of its branches (topk_replay_fits). The values may be overwritten
// (with order keys, nth_element rows too long for shared memory); idx is scratch of their shape.
struct TopkReplayArgs {
  float* values = nullptr;   // [rows][stride]
  uint16_t* idx = nullptr;   // [rows][stride]
  int64_t rows = 0, n = 0, stride = 0, k = 0;
  int64_t pos0 = 0, ratio = 0;  // as TopkArgs
  // Batched decode (optional, with ratio > 0): row r has (positions[r] + 1) / ratio columns (n is
  // the largest), selects min(k, that), and its output follows the rows before it packed.
  const int64_t* positions = nullptr;
  bool in_select_order = false;  // tests: out holds positions 0..k-1 as the algorithm leaves them
  bool force_global = false;     // tests: keep the row in global memory even where it fits shared
  int32_t* out = nullptr;        // [rows][k]
};
struct CandidateArgs {
  const float* scores = nullptr;  // [n][T] of the candidate source
  int64_t n = 0, T = 0, start = 0, ratio = 1, topk_blocks = 0, block_size = 0;
  float* block_scores = nullptr;  // [n][ceil(T/block_size)] scratch
  uint16_t* block_idx = nullptr;  // [n][nb] scratch of the block selection (TopkReplayArgs::idx)
  int32_t* block_sel = nullptr;   // [n][min(topk_blocks, nb)] scratch
  uint32_t* keep = nullptr;       // [n][keep_words(nb)] result: bit b % 32 of word b / 32 = block b kept
};
// 32-bit words of one row's kept-block bits.
__host__ __device__ constexpr int64_t keep_words(int64_t blocks) { return (blocks + 31) / 32; }
struct CandidateMaskArgs {
  float* scores = nullptr;  // [n][T], entries of dropped blocks set to -inf
  const uint32_t* keep = nullptr;  // [n][keep_words(ceil(width / block_size))]
  int64_t n = 0, T = 0, width = 0, block_size = 0;  // width: T of the candidate source
};

// ---- attention ----------------------------------------------------------------------------------
// List entry e of query t: e < 0 skipped; e < split -> row e of pool_a[t]; else row e-split of
// pool_b[t]. Pools are bf16 rows of d values (window rows, compressed rows).
struct SparseAttnArgs {
  const float* q = nullptr;  // [n_q][heads][d]
  const int32_t* list = nullptr;  // [n_q][list_len]
  int64_t list_len = 0;
  const uint16_t* const* pool_a = nullptr;  // [n_q] device pointers
  const uint16_t* const* pool_b = nullptr;  // [n_q] device pointers (may hold nullptrs if unused)
  int64_t split = 0;
  const float* sink = nullptr;  // [heads]
  float scale = 1.0f;
  int64_t n_q = 0, heads = 0, d = 0;
  float* out = nullptr;  // [n_q][heads][d] bf16 values
};

// ---- compressor ----------------------------------------------------------------------------------
// Ratio > 1: carries (kv, score) per slot across calls and emits the softmax-pooled bf16 group for
// every position p with (p+1) % ratio == 0, in order.
struct CompressPoolArgs {
  const float* av = nullptr;  // [n][hd] fp32 LinF32 outputs
  const float* gv = nullptr;
  float* carry_kv = nullptr;     // [ratio][hd] state
  float* carry_score = nullptr;  // [ratio][hd] state
  int64_t n = 0, start = 0, ratio = 2, hd = 0;
  float* pooled = nullptr;  // [groups][hd]
};
struct StoreBf16Args {
  const float* x = nullptr;  // [rows][x_stride]
  int64_t rows = 0, cols = 0, x_stride = 0;
  uint16_t* dst = nullptr;  // [rows][dst_stride]
  int64_t dst_stride = 0;
};

// ---- attention index lists (MODEL.md §5.4 window list) -----------------------------------------
// Decode (one query per sequence at position p): the ring slots oldest first, (p%win)+1 .. win-1,
// 0 .. p%win, a slot > p is -1 (pool_a = the ring with the current row already written).
// Prefill/chunk: for the query at position p the absolute positions max(0, p-win+1) + j,
// j < win_len (= min(layout_end, win)), a position > p is -1; entry = position - pos_base (pool_a =
// the staged window of stage_window). Then the top-k tail: entry e -> e + split (pool_b =
// compressed rows), -1 stays, e >= n_entries -> -1. split bounds the window entries: win for
// decode, the staged row count (start - pos_base + n) for prefill; pass the same to sparse_attention.
struct AttnListArgs {
  int32_t* list = nullptr;  // [n][list_len], list_len = win_len + topk_len
  int64_t n = 0, win = 0, win_len = 0;
  bool decode = false;
  const int64_t* positions = nullptr;  // [n] query positions; nullptr: start + t
  int64_t start = 0, pos_base = 0, split = 0;
  const int32_t* topk = nullptr;  // [n][topk_len] or nullptr
  int64_t topk_len = 0, n_entries = 0;
  // Optional: sparse attention's per-query pool pointers, set by the same launch (fill_pointers of
  // pool_a_value into pool_a[n] and of pool_b_value into pool_b[n]).
  const uint16_t** pool_a = nullptr;
  const uint16_t* pool_a_value = nullptr;
  const uint16_t** pool_b = nullptr;
  const uint16_t* pool_b_value = nullptr;
};
// Window rows of a chunk at positions start .. start+n-1 for the prefill list layout: rows for
// positions pos_base .. start-1 come from the ring (slot = pos % win), then the chunk's rows;
// pos_base = max(0, start - win + 1).
struct StageWindowArgs {
  const uint16_t* ring = nullptr;  // [win][d]
  const uint16_t* kv = nullptr;    // [n][d] the chunk's window rows
  int64_t start = 0, n = 0, win = 0, d = 0;
  uint16_t* out = nullptr;  // [(start - pos_base) + n][d]
};

// ---- embedding, greedy head ----------------------------------------------------------------------
struct EmbedArgs {
  const uint16_t* table = nullptr;  // [vocab][dim] bf16
  int64_t vocab = 0, dim = 0, hc = 1;
  const int32_t* tokens = nullptr;  // [n]; an id outside the vocabulary yields NaN rows
  int64_t n = 0;
  float* out = nullptr;  // [n][hc][dim]: the row copied into every stream
  float* pre_out = nullptr;  // optional [n][hc]: (1, 0, .., 0) per token, the weights a pass's streams start with
};
struct ArgmaxArgs {
  const float* x = nullptr;  // [rows][n]
  int64_t rows = 0, n = 0;
  int32_t* out = nullptr;  // [rows]: first index of the maximum (NaN counts as the maximum)
  // true: std::max_element's pick instead (the host sampler's greedy rule): NaN never beats a
  // number, and a row whose first element is NaN picks 0.
  bool skip_nan = false;
};

// ---- elementwise ----------------------------------------------------------------------------------
// x[r][c] <- bf16(x[r][c] · scale) for c < cols (the indexer's head weights).
struct ScaleRoundArgs {
  float* x = nullptr;  // [rows][stride], in place
  int64_t rows = 0, cols = 0, stride = 0;
  float scale = 1.0f;
};

// dst[i] <- value for i < n (sparse attention's per-query pool pointers).
struct FillPointersArgs {
  const uint16_t** dst = nullptr;  // [n] device array
  int64_t n = 0;
  const uint16_t* value = nullptr;  // any device pointer (or nullptr)
};

// ---- DSpark (MODEL.md §6) -------------------------------------------------------------------------
// out[t][d] = bf16((h[t][0][d] + .. + h[t][hc-1][d]) / hc), streams added in order from zero (a
// target layer's tap).
struct StreamMeanArgs {
  const float* h = nullptr;  // [n][hc][dim]
  int64_t n = 0, hc = 0, dim = 0;
  float* out = nullptr;  // row t at out + t*out_stride
  int64_t out_stride = 0;
};
// logits[r][v] += sum_k head_t[k][v] * embed[ids[r]][k] (fp32 products and sums in k order, no
// fusion): the Markov bias of row r. An id outside the vocabulary yields NaN.
struct MarkovBiasArgs {
  float* logits = nullptr;  // row r at logits + r*logits_stride, vocab values, in place
  int64_t rows = 0, vocab = 0, rank = 0, logits_stride = 0;
  const void* head_t = nullptr;  // [rank][vocab] (the Markov head transposed)
  DenseType head_type = DenseType::BF16;
  const void* embed = nullptr;  // [vocab][rank]
  DenseType embed_type = DenseType::BF16;
  const int32_t* ids = nullptr;  // [rows]
};

namespace raw {
cudaError_t stream_mean(const StreamMeanArgs& a, cudaStream_t s);
cudaError_t markov_bias(const MarkovBiasArgs& a, cudaStream_t s);
cudaError_t scale_round(const ScaleRoundArgs& a, cudaStream_t s);
cudaError_t fill_pointers(const FillPointersArgs& a, cudaStream_t s);
cudaError_t attn_lists(const AttnListArgs& a, cudaStream_t s);
cudaError_t stage_window(const StageWindowArgs& a, cudaStream_t s);
cudaError_t embed(const EmbedArgs& a, cudaStream_t s);
cudaError_t argmax(const ArgmaxArgs& a, cudaStream_t s);
cudaError_t rms_norm(const RmsNormArgs& a, cudaStream_t s);
cudaError_t rope(const RopeArgs& a, cudaStream_t s);
cudaError_t qdq(const QdqArgs& a, cudaStream_t s);
cudaError_t act_quant8(const ActQuantArgs& a, cudaStream_t s);
cudaError_t lin8(const Lin8Args& a, cudaStream_t s);
cudaError_t lin4(const Lin4Args& a, cudaStream_t s);
cudaError_t lin8_group(const Lin8GroupArgs& a, cudaStream_t s);
cudaError_t lin4_group(const Lin4GroupArgs& a, cudaStream_t s);
cudaError_t lin_dense(const DenseArgs& a, cudaStream_t s);
cudaError_t hc_mix(const HcMixArgs& a, cudaStream_t s);
cudaError_t hc_collapse(const HcCollapseArgs& a, cudaStream_t s);
cudaError_t hc_expand(const HcExpandArgs& a, cudaStream_t s);
cudaError_t router(const RouterArgs& a, cudaStream_t s);
cudaError_t swiglu(const SwigluArgs& a, cudaStream_t s);
cudaError_t moe_combine(const MoeCombineArgs& a, cudaStream_t s);
cudaError_t engram_dequant(const EngramDequantArgs& a, cudaStream_t s);
cudaError_t engram_gate(const EngramGateArgs& a, cudaStream_t s);
cudaError_t indexer_scores(const IndexerArgs& a, cudaStream_t s);
// The two indexer kernels indexer_scores picks from (exposed for tests and benchmarks): tiled
// (cudaErrorNotSupported, nothing launched, for shapes it does not take) and one warp per entry.
cudaError_t indexer_scores_tiled(const IndexerArgs& a, cudaStream_t s);
cudaError_t indexer_scores_warp(const IndexerArgs& a, cudaStream_t s);
// The tiled kernel's variants (tile size x chains per thread; tests and benchmarks): indexer_scores_tiled
// launches the one chosen for the shape; _variant launches variant v < indexer_scores_tiled_variants().
int indexer_scores_tiled_variants();
const char* indexer_scores_tiled_variant_name(int v);
cudaError_t indexer_scores_tiled_variant(const IndexerArgs& a, int v, cudaStream_t s);
cudaError_t topk_sorted(const TopkArgs& a, cudaStream_t s);
cudaError_t topk_replay(const TopkReplayArgs& a, cudaStream_t s);
cudaError_t candidate_blocks(const CandidateArgs& a, cudaStream_t s);
cudaError_t candidate_mask(const CandidateMaskArgs& a, cudaStream_t s);
cudaError_t sparse_attention(const SparseAttnArgs& a, int heads_per_block, cudaStream_t s);
// The kernels sparse_attention picks from by shape (exposed for tests and benchmarks): rows = one
// block per query and head group; split = one cluster of blocks per query and head group (few
// queries); tiled = one block per query and 32 heads, all heads of a chunk at once (many queries).
// split and tiled: cudaErrorNotSupported, nothing launched, where the device or the shape does not
// allow them.
cudaError_t sparse_attention_rows(const SparseAttnArgs& a, int heads_per_block, cudaStream_t s);
cudaError_t sparse_attention_split(const SparseAttnArgs& a, cudaStream_t s);
// The split kernel's variants (cluster size x threads; tests and benchmarks): sparse_attention_split
// launches the one chosen for n_q (the others in turn where that one cannot run); _variant launches variant
// v < sparse_attention_split_variants() (cudaErrorNotSupported as above); _max_clusters: clusters of
// variant v the device holds at once at a's shape (0 where it cannot launch).
int sparse_attention_split_variants();
const char* sparse_attention_split_variant_name(int v);
cudaError_t sparse_attention_split_variant(const SparseAttnArgs& a, int v, cudaStream_t s);
int sparse_attention_split_max_clusters(const SparseAttnArgs& a, int v);
// Dynamic shared memory of split variant v for a's list (tests: a variant is refused where
// this exceeds what the device gives a block, ops/smem_limit.h).
size_t sparse_attention_split_smem(const SparseAttnArgs& a, int v);
// The tiled kernel: its wide form (32 heads a block, two chunk buffers) where the device's shared
// memory holds it, else the narrow one (8 heads, one buffer: GB10 at d = 512); same bits.
cudaError_t sparse_attention_tiled(const SparseAttnArgs& a, cudaStream_t s);
// Its forms (tests and benchmarks): 0 wide, 1 narrow; cudaErrorNotSupported as above; _smem: the
// form's dynamic shared memory for rows of d.
int sparse_attention_tiled_variants();
cudaError_t sparse_attention_tiled_variant(const SparseAttnArgs& a, int v, cudaStream_t s);
size_t sparse_attention_tiled_variant_smem(int64_t d, int v);
cudaError_t compress_pool(const CompressPoolArgs& a, cudaStream_t s);
cudaError_t store_bf16(const StoreBf16Args& a, cudaStream_t s);
}  // namespace raw

}  // namespace dsv41::ops::gpu
