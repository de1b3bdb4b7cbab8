#include "runtime/serve_startup.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "dsv41/common/error.h"
#include "dsv41/model/cuda_scratch_plan.h"
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
                            int64_t score_slice_bytes, bool tensor_parallel) {
  // The arena's own layout (shared phases included), so the estimate is what the model allocates.
  model::ScratchPlanInputs in;
  in.tokens = chunk_tokens;
  in.max_context = max_context;
  in.logit_rows = logit_rows;
  in.score_slice_bytes = score_slice_bytes;
  in.tensor_parallel = tensor_parallel;
  return static_cast<uint64_t>(model::plan_cuda_scratch(c, in).total);
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

int64_t cuda_serve_pass_tokens(const ModelConfig& cfg, const ServeMemoryPlan& p, int64_t default_tokens) {
  if (p.world_size > 1) return default_tokens;
  const int64_t need = std::max<int64_t>({p.max_num_batched_tokens, cfg.dspark_block_size, 1});
  return std::min(default_tokens, need);
}

std::vector<BudgetItem> cuda_serve_budget_items(const ModelConfig& c, const ServeMemoryPlan& p, int64_t chunk_tokens,
                                                int64_t max_context, bool unified) {
  DSV_CHECK(p.world_size >= 1, "memory budget: world size must be at least 1");
  return {
      // a tensor-parallel rank uploads its share of the split weights (as the CPU table counts them)
      {budget_item::kWeights, p.weight_bytes / static_cast<uint64_t>(p.world_size)},
      {budget_item::kSequenceStatePool, gib_to_bytes(p.kv_cache_gib, "--kv-cache-gib")},
      {budget_item::kWorkspaces,
       cuda_scratch_bytes(c, chunk_tokens, max_context, model::CudaModelOptions{}.max_logit_rows,
                          model::kIndexScoreSliceBytes, p.world_size > 1) +
           cuda_dspark_scratch_bytes(c, chunk_tokens)},
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
