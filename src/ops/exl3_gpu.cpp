// Planning and validation for the EXL3 CUDA kernels (kernels/exl3/): everything that can go wrong
// with caller input is checked here, so the launchers can trust their arguments.
#include "dsv41/ops/exl3_gpu.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <mutex>
#include <vector>

#include "dsv41/common/error.h"

namespace dsv41::ops {
namespace {

using exl3::cuda::kCounterBytes;
using exl3::cuda::kLargeRows;
using exl3::cuda::kMaxSmallRows;
using exl3::cuda::MoePlan;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("{}: CUDA error {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

void check_matrix(const Exl3Matrix& w, const char* what) {
  DSV_CHECK(w.trellis && w.suh && w.svh, "{}: trellis, suh and svh must be device pointers", what);
  DSV_CHECK(w.k > 0 && w.n > 0 && w.k % 128 == 0 && w.n % 128 == 0,
            "{}: k={} and n={} must be positive multiples of 128", what, w.k, w.n);
  DSV_CHECK(w.bits >= 1 && w.bits <= 8, "{}: bits={} outside 1..8", what, w.bits);
  DSV_CHECK(w.codebook >= 0 && w.codebook <= 2, "{}: codebook {} is not 0 (3INST), 1 (MCG) or 2 (MUL1)", what,
            w.codebook);
  DSV_CHECK(reinterpret_cast<uintptr_t>(w.trellis) % 16 == 0, "{}: trellis must be 16-byte aligned", what);
}

// Splits k-tiles into `want` ranges of a multiple of 8 tiles; returns {splits, tiles per split}.
std::pair<int, int> split_k(int ktiles, int want) {
  want = std::clamp(want, 1, std::max(1, ktiles / 8));
  const int per = ((ktiles + want - 1) / want + 7) / 8 * 8;
  return {(ktiles + per - 1) / per, per};
}

}  // namespace

int current_sm_count() {
  static std::mutex mu;
  static std::vector<int> cache;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(cache.size()) <= dev) cache.resize(dev + 1, 0);
  if (cache[dev] == 0) check_cuda(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev), "SM count");
  return cache[dev];
}

GemmPlan exl3_gemm_plan(const Exl3Matrix& w, int64_t m, GemmPath path, int splits, int batch) {
  check_matrix(w, "exl3_gemm");
  DSV_CHECK(m >= 1, "exl3_gemm: m={} must be at least 1", m);
  DSV_CHECK(splits >= 0, "exl3_gemm: splits={} must not be negative", splits);
  DSV_CHECK(batch >= 1 && batch <= 64, "exl3_gemm: batch={} outside 1..64", batch);
  GemmPlan plan;
  plan.batch = batch;
  if (path == GemmPath::Auto) {
    path = (m <= 4 && w.codebook == 2) ? GemmPath::Int8 : (m <= 8 ? GemmPath::F16 : GemmPath::Large);
  }
  DSV_CHECK(batch == 1 || path != GemmPath::Large, "exl3_gemm: a batch of {} matrices takes m <= 8 rows, got {}",
            batch, m);
  DSV_CHECK(path != GemmPath::Int8 || (w.codebook == 2 && m <= 4),
            "exl3_gemm: the int8 path needs the MUL1 codebook and m <= 4 (codebook {}, m {})", w.codebook, m);
  DSV_CHECK(path != GemmPath::F16 || m <= 8, "exl3_gemm: the f16 path takes m <= 8 rows, got {}", m);
  plan.path = path;
  const int ktiles = w.k / 16;
  const int ngroups = w.n / 128;
  const int sms = current_sm_count();
  if (path == GemmPath::Large) {
    plan.m_blocks = static_cast<int>((m + kLargeRows - 1) / kLargeRows);
    int want = 1;
    while (ngroups * plan.m_blocks * want < 2 * sms && ktiles / (8 * (want + 1)) >= 2 && want < 16) ++want;
    if (splits > 0) want = splits;
    std::tie(plan.splits, plan.kt_per_split) = split_k(ktiles, want);
  } else {
    // Persistent stream-K grid (one unit = one column group x 128 k-rows): about one resident wave,
    // or for calls of fewer units than a wave holds at 4 units a block, blocks of a whole divisor
    // of the units a column group has (up to 4, at least half an SM count of blocks), so that no
    // block straddles two groups and each group's partial sums are few (bench/RESULTS.md, "grid
    // sweep"). A forced `splits` asks for that many blocks per column group.
    plan.m_blocks = 1;
    plan.kt_per_split = 8;
    const int per_group = ktiles / 8;
    const int units = batch * ngroups * per_group;
    const int wave = sms * std::max(1, exl3::cuda::stream_blocks_per_sm(w, path));
    int grid = wave;
    if (splits > 0) {
      grid = batch * ngroups * splits;
    } else {
      int per_block = 1;
      for (int c = std::min(4, per_group); c >= 1; --c) {
        if (per_group % c != 0) continue;
        per_block = c;
        if (units / c >= (sms + 1) / 2) break;
      }
      grid = std::min(wave, units / per_block);
    }
    plan.grid = std::clamp(grid, 1, units);
    plan.splits = (plan.grid + batch * ngroups - 1) / (batch * ngroups);
  }
  DSV_CHECK(static_cast<size_t>(batch) * ngroups * plan.m_blocks * 4 <= kCounterBytes,
            "exl3_gemm: n={} with m={} (batch {}) exceeds the ticket counter space", w.n, m, batch);
  plan.workspace = exl3::cuda::gemm_workspace_bytes(w, m, plan);
  return plan;
}

int64_t exl3_gemm_max_rows(const Exl3Matrix& w) {
  check_matrix(w, "exl3_gemm");
  const int64_t blocks = static_cast<int64_t>(kCounterBytes / 4) / (w.n / 128);
  DSV_CHECK(blocks >= 1, "exl3_gemm: n={} has more column groups than the ticket counter space", w.n);
  return std::max<int64_t>(8, blocks * kLargeRows);  // the small paths (m <= 8) keep no row blocks
}

size_t exl3_gemm_workspace_bytes(const Exl3Matrix& w, int64_t m_max) {
  m_max = std::min(m_max, exl3_gemm_max_rows(w));  // larger calls are split (exl3_gemm_max_rows)
  size_t bytes = 0;
  for (int64_t m = 1; m <= std::min<int64_t>(m_max, 9); ++m) bytes = std::max(bytes, exl3_gemm_plan(w, m).workspace);
  if (m_max > 8) {
    // Large-path workspace grows with m; the split count only shrinks as m grows.
    for (int64_t m : {m_max, std::min<int64_t>(m_max, 64), std::min<int64_t>(m_max, 128)})
      bytes = std::max(bytes, exl3_gemm_plan(w, m).workspace);
  }
  return bytes;
}

void exl3_workspace_init(void* workspace, size_t bytes, cudaStream_t stream) {
  DSV_CHECK(workspace && bytes >= kCounterBytes, "exl3 workspace: need at least {} bytes", kCounterBytes);
  check_cuda(cudaMemsetAsync(workspace, 0, kCounterBytes, stream), "exl3 workspace init");
}

void exl3_gemm(const GemmParams& p, cudaStream_t stream) {
  const GemmPlan plan = exl3_gemm_plan(p.w, p.m, p.path, p.splits, p.batch);
  DSV_CHECK(p.x && p.y, "exl3_gemm: x and y must be device pointers");
  DSV_CHECK(p.batch == 1 || (p.batch_w && p.x_batch_stride >= 0 && p.y_batch_stride >= p.y_cols),
            "exl3_gemm: a batch of {} needs the device array of its matrices, x_batch_stride >= 0 and "
            "y_batch_stride={} >= y_cols={} (outputs must not overlap)",
            p.batch, p.y_batch_stride, p.y_cols);
  DSV_CHECK(p.x_cols >= 1 && p.x_cols <= p.w.k && p.x_stride >= p.x_cols,
            "exl3_gemm: x_cols={} must be in 1..k={} and x_stride={} >= x_cols", p.x_cols, p.w.k, p.x_stride);
  DSV_CHECK(p.y_cols >= 1 && p.y_cols <= p.w.n && p.y_stride >= p.y_cols,
            "exl3_gemm: y_cols={} must be in 1..n={} and y_stride={} >= y_cols", p.y_cols, p.w.n, p.y_stride);
  DSV_CHECK(p.workspace && p.workspace_bytes >= plan.workspace,
            "exl3_gemm: workspace of {} bytes, this call needs {}", p.workspace_bytes, plan.workspace);
  check_cuda(exl3::cuda::launch_gemm(p, plan, stream), "exl3_gemm launch");
}

void exl3_reconstruct(const Exl3Matrix& w, uint16_t* w_hat, cudaStream_t stream) {
  check_matrix(w, "exl3_reconstruct");
  DSV_CHECK(w_hat, "exl3_reconstruct: output must be a device pointer");
  check_cuda(exl3::cuda::launch_reconstruct(w, w_hat, stream), "exl3_reconstruct launch");
}

namespace {

MoePlan moe_plan(const MoeParams& p) {
  DSV_CHECK(p.gate && p.up && p.down, "exl3_moe: gate, up and down tables must be device pointers");
  DSV_CHECK(p.n_experts >= 1 && p.n_experts <= 1023, "exl3_moe: n_experts={} outside 1..1023", p.n_experts);
  DSV_CHECK(p.m >= 1 && p.m <= 8, "exl3_moe: m={} outside 1..8", p.m);
  DSV_CHECK(p.topk >= 1 && p.m * p.topk <= 128, "exl3_moe: m*topk={} outside 1..128", p.m * p.topk);
  DSV_CHECK(p.hidden > 0 && p.inter > 0 && p.hidden % 128 == 0 && p.inter % 128 == 0,
            "exl3_moe: hidden={} and inter={} must be positive multiples of 128", p.hidden, p.inter);
  DSV_CHECK(p.max_bits >= 1 && p.max_bits <= 8, "exl3_moe: max_bits={} outside 1..8", p.max_bits);
  DSV_CHECK(p.x && p.y && p.topk_ids && p.topk_weights, "exl3_moe: x, y, topk_ids and topk_weights must be set");
  DSV_CHECK(p.x_cols >= 1 && p.x_cols <= p.hidden && p.x_stride >= p.x_cols,
            "exl3_moe: x_cols={} must be in 1..hidden={} and x_stride >= x_cols", p.x_cols, p.hidden);
  DSV_CHECK(p.y_cols >= 1 && p.y_cols <= p.hidden && p.y_stride >= p.y_cols,
            "exl3_moe: y_cols={} must be in 1..hidden={} and y_stride >= y_cols", p.y_cols, p.hidden);
  auto kind_ok = [](int bits, int cb) { return bits >= 1 && bits <= 8 && cb >= 0 && cb <= 2; };
  const bool uniform = kind_ok(p.gate_up_bits, p.gate_up_codebook) && kind_ok(p.down_bits, p.down_codebook);
  DSV_CHECK(p.stream != 1 || uniform,
            "exl3_moe: the stream path needs one bit width and codebook for every gate/up matrix and one for every "
            "down matrix (gate_up_bits={}, down_bits={})",
            p.gate_up_bits, p.down_bits);
  MoePlan plan;
  plan.int8 = p.int8 != 0 && p.m <= 4;
  plan.max_slots = p.m * p.topk + (p.has_shared ? 1 : 0);
  const int sms = current_sm_count();
  if (p.stream != 0 && uniform) {
    // One resident wave per projection, never more blocks than the most matrices' units.
    plan.stream = true;
    plan.int8_gu = plan.int8 && p.gate_up_codebook == 2;
    plan.int8_dn = plan.int8 && p.down_codebook == 2;
    const int per_sm_gu = exl3::cuda::moe_stream_blocks_per_sm(p.gate_up_bits, p.gate_up_codebook, plan.int8_gu);
    const int per_sm_dn = exl3::cuda::moe_stream_blocks_per_sm(p.down_bits, p.down_codebook, plan.int8_dn);
    DSV_CHECK(per_sm_gu > 0 && per_sm_dn > 0, "exl3_moe: the stream kernels cannot run on this device");
    const int64_t units = static_cast<int64_t>(plan.max_slots) * (p.hidden / 128) * (p.inter / 128);
    plan.grid_gu = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(sms) * per_sm_gu, 2 * units));
    plan.grid_dn = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(sms) * per_sm_dn, units));
    plan.workspace = exl3::cuda::moe_workspace_bytes(p, plan);
    DSV_CHECK(plan.workspace > 0, "exl3_moe: too many column groups for the ticket counter space");
    return plan;
  }
  const int slots_typ = std::min(plan.max_slots, p.topk + (p.has_shared ? 1 : 0));
  auto pick = [&](int ktiles, int blocks_per_split, int forced, int& splits, int& kt) {
    const int min_splits = (ktiles * 16 + kMaxSmallRows - 1) / kMaxSmallRows;
    int want = forced > 0 ? forced : (4 * sms + blocks_per_split - 1) / blocks_per_split;
    std::tie(splits, kt) = split_k(ktiles, std::max(want, min_splits));
    DSV_CHECK(kt * 16 <= kMaxSmallRows, "exl3_moe: {} splits leave more than {} rows per block", splits,
              kMaxSmallRows);
  };
  pick(p.hidden / 16, slots_typ * 2 * (p.inter / 128), p.splits_gate_up, plan.splits_gu, plan.kt_gu);
  pick(p.inter / 16, slots_typ * (p.hidden / 128), p.splits_down, plan.splits_dn, plan.kt_dn);
  DSV_CHECK(static_cast<size_t>(plan.max_slots) * (p.inter / 128) * 4 + (p.hidden / 128) * 4 <= kCounterBytes,
            "exl3_moe: too many column groups for the ticket counter space");
  plan.smem_gu = exl3::cuda::moe_smem_bytes(p.max_bits, plan.kt_gu * 16);
  plan.smem_dn = exl3::cuda::moe_smem_bytes(p.max_bits, plan.kt_dn * 16);
  plan.workspace = exl3::cuda::moe_workspace_bytes(p, plan);
  return plan;
}

}  // namespace

size_t exl3_moe_workspace_bytes(const MoeParams& p) { return moe_plan(p).workspace; }

void exl3_moe(const MoeParams& p, cudaStream_t stream) {
  const MoePlan plan = moe_plan(p);
  DSV_CHECK(p.workspace && p.workspace_bytes >= plan.workspace, "exl3_moe: workspace of {} bytes, this call needs {}",
            p.workspace_bytes, plan.workspace);
  check_cuda(exl3::cuda::launch_moe(p, plan, stream), "exl3_moe launch");
}

void exl3_grouped_input(const GroupedInputParams& p, cudaStream_t stream) {
  DSV_CHECK(p.sets >= 1 && p.sets <= exl3::cuda::kGroupedSets, "exl3_grouped_input: {} sets, 1..{} supported", p.sets,
            exl3::cuda::kGroupedSets);
  DSV_CHECK(p.k > 0 && p.k % 128 == 0, "exl3_grouped_input: k={} must be a positive multiple of 128", p.k);
  DSV_CHECK(p.rows >= 0, "exl3_grouped_input: rows={} must not be negative", p.rows);
  if (p.rows == 0) return;
  DSV_CHECK(p.x && p.matrix_of, "exl3_grouped_input: x and matrix_of must be device pointers");
  DSV_CHECK(p.x_cols >= 1 && p.x_cols <= p.k && p.x_stride >= p.x_cols,
            "exl3_grouped_input: x_cols={} must be in 1..k={} and x_stride={} >= x_cols", p.x_cols, p.k, p.x_stride);
  for (int s = 0; s < p.sets; ++s)
    DSV_CHECK(p.mats[s] && p.xh[s], "exl3_grouped_input: set {} needs a matrix array and an x_had buffer", s);
  check_cuda(exl3::cuda::launch_grouped_input(p, stream), "exl3_grouped_input launch");
}

void exl3_grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream) {
  DSV_CHECK(p.bits >= 1 && p.bits <= 8, "exl3_grouped_gemm: bits={} outside 1..8", p.bits);
  DSV_CHECK(p.codebook >= 0 && p.codebook <= 2, "exl3_grouped_gemm: codebook {} is not 0, 1 or 2", p.codebook);
  DSV_CHECK(p.k > 0 && p.n > 0 && p.k % 128 == 0 && p.n % 128 == 0,
            "exl3_grouped_gemm: k={} and n={} must be positive multiples of 128", p.k, p.n);
  DSV_CHECK(p.ntiles >= 0 && p.ntiles <= 65535, "exl3_grouped_gemm: {} tiles, at most 65,535 a launch", p.ntiles);
  DSV_CHECK(p.row_class >= 1 && p.row_class <= 4, "exl3_grouped_gemm: row class {} outside 1..4", p.row_class);
  DSV_CHECK(p.y_cols >= 1 && p.y_cols <= p.n && p.y_stride >= p.y_cols,
            "exl3_grouped_gemm: y_cols={} must be in 1..n={} and y_stride={} >= y_cols", p.y_cols, p.n, p.y_stride);
  if (p.ntiles == 0) return;
  DSV_CHECK(p.tiles, "exl3_grouped_gemm: tiles must be a device pointer");
  for (int s = 0; s < exl3::cuda::kGroupedSets; ++s)
    DSV_CHECK(!p.mats[s] == !p.xh[s] && !p.mats[s] == !p.y[s],
              "exl3_grouped_gemm: set {} needs its matrix array, x_had and output together", s);
  DSV_CHECK(p.mats[0], "exl3_grouped_gemm: set 0 needs a matrix array");
  check_cuda(exl3::cuda::launch_grouped_gemm(p, stream), "exl3_grouped_gemm launch");
}

}  // namespace dsv41::ops
#endif
