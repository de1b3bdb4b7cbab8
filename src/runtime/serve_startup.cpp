#include "runtime/serve_startup.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "dsv41/common/error.h"
#include "dsv41/runtime/progress.h"

#if DSV41_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace dsv41::runtime {

uint64_t checkpoint_weight_bytes(const Checkpoint& ck) {
  uint64_t n = 0;
  for (const TensorInfo* t : ck.tensors())
    if (!is_engram_table_tensor(t->name)) n += t->nbytes;
  return n;
}

std::vector<BudgetItem> serve_budget_items(const ModelConfig& c, const ServeMemoryPlan& p) {
  DSV_CHECK(p.world_size >= 1, "memory budget: world size must be at least 1");
  const uint64_t f32 = sizeof(float);
  const uint64_t seqs = static_cast<uint64_t>(std::max<int64_t>(p.max_num_seqs, 1));
  const uint64_t step = static_cast<uint64_t>(std::max<int64_t>(p.max_num_batched_tokens, 1));
  const uint64_t dim = static_cast<uint64_t>(c.hidden_size), hc = static_cast<uint64_t>(c.hc_mult);
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
  // Each running sequence keeps one logits row; a step holds its residual streams [tokens][hc][dim]
  // and about a dozen temporaries of that size in fp32 (norms, attention, MoE inputs/outputs).
  const uint64_t workspaces = seqs * vocab * f32 + 16 * step * hc * dim * f32;
  return {
      {budget_item::kWeights, p.weight_bytes / static_cast<uint64_t>(p.world_size)},
      {budget_item::kSequenceStatePool, gib_to_bytes(p.kv_cache_gib, "--kv-cache-gib")},
      {budget_item::kWorkspaces, workspaces},
      {budget_item::kCudaGraphs, 0},
      {budget_item::kNcclBuffers, 0},
      {budget_item::kEngramCache, gib_to_bytes(p.engram_cache_gib, "--engram-cache-gib")},
  };
}

int cuda_device_count(std::string* why) {
#if DSV41_HAS_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)";
  return n;
#else
  if (why) *why = "this dsv41-serve was built without CUDA (configure with -DDSV41_CUDA=ON)";
  return 0;
#endif
}

CudaDeviceInfo cuda_device_info(int device) {
#if DSV41_HAS_CUDA
  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) fail("CUDA device {}: cannot read its properties ({})", device, cudaGetErrorString(e));
  CudaDeviceInfo info;
  info.name = prop.name;
  info.integrated = prop.integrated != 0;
  // cudaMemGetInfo reports the current device's memory: make `device` current (the engine uses it).
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(reinterpret_cast<size_t*>(&info.free_bytes), reinterpret_cast<size_t*>(&info.total_bytes));
  if (e != cudaSuccess) fail("CUDA device {}: cannot read its free memory ({})", device, cudaGetErrorString(e));
  return info;
#else
  fail("CUDA device {}: this dsv41-serve was built without CUDA", device);
#endif
}

MemorySource cuda_memory_source(int device) {
  const CudaDeviceInfo info = cuda_device_info(device);
  if (info.integrated) return meminfo_source();
  return device_memory_source([device] { return cuda_device_info(device).free_bytes; },
                              "CUDA device " + std::to_string(device) + " (" + info.name + ") free memory");
}

uint64_t cuda_scratch_bytes(const ModelConfig& c, int64_t chunk_tokens, int64_t max_context, int64_t logit_rows,
                            int64_t score_slice_bytes) {
  DSV_CHECK(chunk_tokens >= 1 && max_context >= 1 && logit_rows >= 1 && score_slice_bytes >= 1,
            "CUDA scratch: chunk {}, context {}, logit rows {} and score slice bytes {} must be positive",
            chunk_tokens, max_context, logit_rows, score_slice_bytes);
  const int64_t m = chunk_tokens, dim = c.hidden_size, hc = c.hc_mult, hd = c.head_dim, ihd = c.index_head_dim;
  const int64_t H = c.num_attention_heads, IH = c.index_n_heads, GR = c.o_groups * c.o_lora_rank;
  // The DSpark stages may route over more experts / slots than the target layers (the arena takes
  // the larger of each).
  const int64_t inter = c.moe_intermediate_size, K = std::max(c.num_experts_per_tok, c.dspark_topk()),
                E = std::max(c.n_routed_experts, c.dspark_experts());
  const int64_t cols = c.n_engram_columns(), edim = cols * c.engram_head_dim, tk = std::max<int64_t>(1, c.index_topk);
  int64_t min_ratio = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.ratio(l) > 0 && (min_ratio == 0 || c.ratio(l) < min_ratio)) min_ratio = c.ratio(l);
  const int64_t t_max = min_ratio > 0 ? std::max<int64_t>(1, max_context / min_ratio) : 1;
  // fp32 values per token of a pass: residual streams and mixes, attention (queries, outputs,
  // compressor rows, indexer queries), MoE (routing, expert and shared activations; the routed
  // rows counted K + 1 times, as a tensor-parallel rank's arena holds them) and Engram
  // rows; then int32 lists, the raw Engram rows of every Engram layer, and the bytes of the
  // quantised activation codes with their scales. The logits hold min(chunk, logit_rows) rows; the
  // index score rows are sliced (index_score_slicing), so they do not grow with chunk x context.
  const int64_t floats = hc * dim + hc + 4 * dim + 2 * (2 + hc) * hc + c.q_lora_rank + 2 * H * hd + GR + 5 * hd + ihd +
                         IH * ihd + IH + K + 2 * E + 3 * K * inter + (K + 1) * dim + 2 * inter + edim + (hc + 1) * dim + edim;
  const int64_t ints = tk + c.sliding_window + tk + K + std::max<int64_t>(1, cols) + 1 + 2 * 2;
  const int64_t engram_raw =
      static_cast<int64_t>(c.engram_layer_ids.size()) * cols * (c.engram_head_dim + (c.engram_head_dim + 31) / 32);
  const int64_t taps_in = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * dim;  // DSpark main_proj
  const int64_t max_in = std::max({dim, c.q_lora_rank, GR, inter, edim, H * hd, hd, K * inter, taps_in});
  // the linears' input codes and scales, then those of the normed rows x and the q latent
  const int64_t codes = max_in + max_in / 32 * 4 + 4 + dim + c.q_lora_rank + (dim + c.q_lora_rank) / 32 * 4 + 8;
  const int64_t bf16 = 2 * hd + (c.sliding_window + 1) * hd * 2 / m + 2 * hd;
  // positions (int64), the batched decode's pools (a pointer per layer, two pools, row) and the
  // mHC mix counters.
  const int64_t wide = 8 + 2 * c.num_hidden_layers * 8 + 4;
  // The grouped MoE's bucketing (moe_grouped_sort_ints of m x K pairs, 16-pair tiles).
  const int64_t pairs = m * K, moe_sort = (E + 2 + 2 * (pairs / 16 + std::min(pairs, E)) + pairs) * 4;
  const int64_t per_token = 4 * floats + 4 * ints + engram_raw + codes + bf16 + wide;
  constexpr int64_t kPieces = 64, kAlign = 256;  // each buffer rounds up to 256 bytes
  const int64_t logits = std::min(m, logit_rows) * c.vocab_size * 4;
  const int64_t scores = model::index_score_slicing(m, t_max, score_slice_bytes).floats() * 4;
  return static_cast<uint64_t>(m * per_token + logits + scores + moe_sort + kPieces * kAlign);
}

uint64_t cuda_dspark_scratch_bytes(const ModelConfig& c, int64_t chunk_tokens) {
  DSV_CHECK(chunk_tokens >= 1, "DSpark scratch: chunk {} must be positive", chunk_tokens);
  if (c.num_nextn_predict_layers <= 0 || c.dspark_block_size <= 0) return 0;
  const int64_t rows = chunk_tokens, dim = c.hidden_size, B = c.dspark_block_size;
  const int64_t taps = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  // fp32 taps [rows][taps][dim], input and pre-mix rows [rows][dim], ring KV [rows][head_dim];
  // int32 ids [(B+1)][rows] and lists [rows][window+B]; int64 positions.
  const int64_t floats = rows * (taps * dim + 2 * dim + c.head_dim);
  const int64_t ints = (B + 1) * rows + rows * (c.sliding_window + B);
  return static_cast<uint64_t>(4 * floats + 4 * ints + 8 * rows);
}

std::vector<BudgetItem> cuda_serve_budget_items(const ModelConfig& c, const ServeMemoryPlan& p, int64_t chunk_tokens,
                                                int64_t max_context, bool unified) {
  return {
      {budget_item::kWeights, p.weight_bytes},
      {budget_item::kSequenceStatePool, gib_to_bytes(p.kv_cache_gib, "--kv-cache-gib")},
      {budget_item::kWorkspaces,
       cuda_scratch_bytes(c, chunk_tokens, max_context) + cuda_dspark_scratch_bytes(c, chunk_tokens)},
      {budget_item::kCudaGraphs, 0},
      {budget_item::kNcclBuffers, 0},
      {budget_item::kEngramCache, unified ? gib_to_bytes(p.engram_cache_gib, "--engram-cache-gib") : 0},
  };
}

std::vector<BudgetItem> cuda_host_budget_items(const ServeMemoryPlan& p) {
  return {{budget_item::kEngramCache, gib_to_bytes(p.engram_cache_gib, "--engram-cache-gib")}};
}

uint64_t preload_weights(const Checkpoint& ck) {
  std::vector<const TensorInfo*> weights;
  uint64_t total = 0;
  for (const TensorInfo* t : ck.tensors())
    if (!is_engram_table_tensor(t->name) && t->data != nullptr && t->nbytes > 0) {
      weights.push_back(t);
      total += t->nbytes;
    }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  Progress progress("loading weights", total);
  volatile uint8_t sink = 0;
  for (const TensorInfo* t : weights) {
    // Ask for read-ahead of the whole range, then touch one byte per page in order.
    const auto base = reinterpret_cast<uintptr_t>(t->data);
    const uintptr_t start = base & ~(page - 1);
    madvise(reinterpret_cast<void*>(start), t->nbytes + (base - start), MADV_WILLNEED);
    constexpr uint64_t kChunk = uint64_t{64} << 20;
    for (uint64_t off = 0; off < t->nbytes; off += kChunk) {
      const uint64_t end = std::min(t->nbytes, off + kChunk);
      for (uint64_t b = off; b < end; b += page) sink = sink + t->data[b];
      progress.advance(end - off);
    }
  }
  progress.finish();
  (void)sink;
  return total;
}

}  // namespace dsv41::runtime
