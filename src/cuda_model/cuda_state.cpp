// Sequence state of the CUDA backend, on the device: a bf16 window ring per layer, and per KV
// source floor(room / ratio) compressed rows (bf16 QDQ4b values), as many index keys (bf16 QDQ4a
// values) where the layer owns them, and the fp32 compressor carries of ratio > 1 (kv 0, score
// -inf, as the CPU engine starts them).
//
// The buffers are carved from two blocks taken from a memory resource: a fixed one (rings,
// carries) and a growing one (compressed KV, index keys). A pooled state (the server's StatePool
// over the model's device memory) takes exactly state_bytes(room) bytes; growing the room takes a
// new growing block, copies the entries on the model's stream and returns the old block. The
// Engram n-gram history (at most max_ngram - 1 ids) stays on the host, reserved once: it is not
// device memory and not part of state_bytes().
#include "cuda_model/cuda_impl.h"

#if DSV41_HAS_CUDA
#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>

#include "dsv41/common/error.h"

namespace dsv41::model::cuda {

using ops::gpu::check_cuda;

// ---- device memory resources ----

StateBlock::StateBlock(std::pmr::memory_resource* memory, int64_t bytes) {
  DSV_CHECK(bytes >= 0, "sequence state block of {} bytes", bytes);
  if (bytes == 0) return;
  p_ = memory->allocate(static_cast<size_t>(bytes), kStateAlignment);
  memory_ = memory;
  n_ = static_cast<size_t>(bytes);
}

void StateBlock::release() {
  if (p_ != nullptr) memory_->deallocate(p_, n_, kStateAlignment);
  memory_ = nullptr;
  p_ = nullptr;
  n_ = 0;
}

StateSpan StateBlock::span(int64_t offset, int64_t bytes) const {
  if (bytes == 0) return {};
  DSV_ASSERT(offset >= 0 && static_cast<size_t>(offset + bytes) <= n_, "span [{}, +{}) outside a block of {}", offset, bytes, n_);
  return {static_cast<uint8_t*>(p_) + offset, static_cast<size_t>(bytes)};
}

StreamStateMemory::StreamStateMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {
  int supported = 0;
  check_cuda(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), "memory pool support");
  if (!supported) return;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  check_cuda(cudaMemPoolCreate(&pool_, &props), "sequence-state memory pool");
  // Keep what was reserved across synchronisations: the StatePool already limits the total, and
  // returning memory to the driver at every sync would make each state allocation a driver call.
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  check_cuda(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep), "memory pool threshold");
}

StreamStateMemory::~StreamStateMemory() {
  if (pool_ == nullptr) return;
  // Queued frees complete with the stream; only then is the pool empty.
  cudaStreamSynchronize(stream_);
  cudaMemPoolDestroy(pool_);
}

void* StreamStateMemory::do_allocate(size_t bytes, size_t alignment) {
  DSV_CHECK(alignment <= kStateAlignment, "device state memory: alignment {} above {}", alignment, kStateAlignment);
  // The scheduler thread is not the thread that loaded the model: make its device current.
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  void* p = nullptr;
  const cudaError_t e =
      pool_ != nullptr ? cudaMallocFromPoolAsync(&p, bytes, pool_, stream_) : cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for the next call
    fail("sequence state: cannot allocate {} bytes of device memory on CUDA device {} ({})", bytes, device_,
         cudaGetErrorString(e));
  }
  return p;
}

void StreamStateMemory::do_deallocate(void* p, size_t, size_t) {
  cudaSetDevice(device_);
  const cudaError_t e = pool_ != nullptr ? cudaFreeAsync(p, stream_) : cudaFree(p);
  if (e != cudaSuccess) spdlog::error("sequence state: freeing device memory failed ({})", cudaGetErrorString(e));
}

namespace {

class DeviceHeapMemory final : public std::pmr::memory_resource {
  void* do_allocate(size_t bytes, size_t alignment) override {
    DSV_CHECK(alignment <= kStateAlignment, "device state memory: alignment {} above {}", alignment, kStateAlignment);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("sequence state: cannot allocate {} bytes of device memory ({})", bytes, cudaGetErrorString(e));
    }
    return p;
  }
  void do_deallocate(void* p, size_t, size_t) override {
    // cudaFree waits for the device, so no kernel still reads the buffer.
    const cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) spdlog::error("sequence state: freeing device memory failed ({})", cudaGetErrorString(e));
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }
};

}  // namespace

std::pmr::memory_resource& device_heap_memory() {
  static DeviceHeapMemory memory;
  return memory;
}

// ---- layout ----

namespace {

// Offsets of the buffers inside the two blocks; every buffer starts on kStateAlignment and an empty
// buffer takes no room. state_bytes() and the carving below use this one walk, so the bytes a state
// takes are exactly the bytes reported.
struct FixedLayout {
  std::vector<int64_t> ring;                     // [layer]
  std::vector<int64_t> carry_kv, carry_score;    // [layer], -1 where the layer has none
  std::vector<int64_t> dspark_ring;              // [DSpark stage] (cuda_dspark.cpp)
  int64_t ring_bytes = 0, total = 0;
};

struct GrowingLayout {
  std::vector<int64_t> entries;                  // [layer] compressed entries of room
  std::vector<int64_t> compressed, index_keys;   // [layer] offsets, -1 where none
  int64_t total = 0;
};

int64_t take(int64_t& total, int64_t bytes) {
  const int64_t at = total;
  total += state_align(bytes);
  return at;
}

FixedLayout fixed_layout(const Impl& m) {
  const ModelConfig& c = m.cfg;
  const auto L = static_cast<size_t>(c.num_hidden_layers);
  FixedLayout f;
  f.ring_bytes = c.sliding_window * c.head_dim * 2;
  f.ring.assign(L, -1);
  f.carry_kv.assign(L, -1);
  f.carry_score.assign(L, -1);
  for (size_t l = 0; l < L; ++l) f.ring[l] = take(f.total, f.ring_bytes);
  for (int64_t s = 0; s < m.dspark_stages; ++s) f.dspark_ring.push_back(take(f.total, f.ring_bytes));
  for (const GpuBlock& b : m.blocks) {
    if (!b.has_compressor || b.ratio <= 1) continue;
    const int64_t carry = b.ratio * c.head_dim * 4;
    f.carry_kv[static_cast<size_t>(b.layer)] = take(f.total, carry);
    f.carry_score[static_cast<size_t>(b.layer)] = take(f.total, carry);
  }
  return f;
}

GrowingLayout growing_layout(const Impl& m, int64_t capacity_tokens) {
  const ModelConfig& c = m.cfg;
  const auto L = static_cast<size_t>(c.num_hidden_layers);
  GrowingLayout g;
  g.entries.assign(L, 0);
  g.compressed.assign(L, -1);
  g.index_keys.assign(L, -1);
  for (const GpuBlock& b : m.blocks) {
    if (!b.has_compressor || b.ratio <= 0) continue;
    const auto l = static_cast<size_t>(b.layer);
    g.entries[l] = capacity_tokens / b.ratio;
    g.compressed[l] = take(g.total, g.entries[l] * c.head_dim * 2);
    if (b.has_index_keys) g.index_keys[l] = take(g.total, g.entries[l] * c.index_head_dim * 2);
  }
  return g;
}

}  // namespace

int64_t Impl::state_bytes(int64_t capacity_tokens) const {
  DSV_CHECK(capacity_tokens >= 0, "sequence capacity must not be negative, got {}", capacity_tokens);
  return fixed_layout(*this).total + growing_layout(*this, capacity_tokens).total;
}

int64_t Impl::state_bytes() const { return state_bytes(max_context); }

std::unique_ptr<CudaSeqState> Impl::make_state() const { return make_state(&device_heap_memory(), max_context); }

std::unique_ptr<CudaSeqState> Impl::make_state(std::pmr::memory_resource* memory, int64_t capacity_tokens) const {
  const ModelConfig& c = cfg;
  DSV_CHECK(capacity_tokens >= 0 && capacity_tokens <= max_context,
            "CUDA sequence state: room for {} tokens is outside 0..{} (the context this model was loaded for)",
            capacity_tokens, max_context);
  auto st = std::make_unique<CudaSeqState>();
  st->owner = this;
  st->memory = memory;
  const FixedLayout f = fixed_layout(*this);
  st->fixed = StateBlock(memory, f.total);
  // Rings start zeroed, carries kv 0 / score -inf. All on the model's stream: stream-ordered
  // memory is valid there first, and the forward that follows runs there too.
  if (f.total > 0) check_cuda(cudaMemsetAsync(st->fixed.get(), 0, static_cast<size_t>(f.total), stream), "state clear");
  for (size_t l = 0; l < f.ring.size(); ++l) st->ring.push_back(st->fixed.span(f.ring[l], f.ring_bytes));
  for (int64_t o : f.dspark_ring) st->dspark.ring.push_back(st->fixed.span(o, f.ring_bytes));
  st->kv.resize(static_cast<size_t>(c.num_hidden_layers));
  std::vector<float> minus_inf;
  for (const GpuBlock& b : blocks) {
    if (!b.has_compressor || b.ratio <= 1) continue;
    const auto l = static_cast<size_t>(b.layer);
    const int64_t carry = b.ratio * c.head_dim * 4;
    GpuKvSource& k = st->kv[l];
    k.carry_kv = st->fixed.span(f.carry_kv[l], carry);
    k.carry_score = st->fixed.span(f.carry_score[l], carry);
    minus_inf.assign(static_cast<size_t>(b.ratio * c.head_dim), -INFINITY);
    // From pageable memory the call returns once the source is staged, so the vector may change.
    check_cuda(cudaMemcpyAsync(k.carry_score.get(), minus_inf.data(), static_cast<size_t>(carry),
                               cudaMemcpyHostToDevice, stream),
               "state carry init");
  }
  if (!engram_hash.empty()) st->engram_history.reserve(static_cast<size_t>(std::max<int64_t>(0, c.engram_max_ngram_size - 1)));
  reserve_state(*st, capacity_tokens);
  return st;
}

void Impl::reserve_state(CudaSeqState& st, int64_t capacity_tokens) const {
  DSV_CHECK(capacity_tokens >= 0 && capacity_tokens <= max_context,
            "CUDA sequence state: room for {} tokens is outside 0..{} (the context this model was loaded for)",
            capacity_tokens, max_context);
  DSV_CHECK(st.memory != nullptr, "sequence state has no memory resource");
  if (st.capacity_tokens >= capacity_tokens) return;
  const ModelConfig& c = cfg;
  const GrowingLayout g = growing_layout(*this, capacity_tokens);
  StateBlock grown(st.memory, g.total);
  for (const GpuBlock& b : blocks) {
    if (!b.has_compressor || b.ratio <= 0) continue;
    const auto l = static_cast<size_t>(b.layer);
    GpuKvSource& k = st.kv[l];
    const int64_t n = g.entries[l];
    const StateSpan compressed = grown.span(g.compressed[l], n * c.head_dim * 2);
    const StateSpan keys = g.index_keys[l] >= 0 ? grown.span(g.index_keys[l], n * c.index_head_dim * 2) : StateSpan{};
    // The entries written so far move to the new block (queued before the old block's release).
    if (k.n_entries > 0) {
      check_cuda(cudaMemcpyAsync(compressed.get(), k.compressed.get(), static_cast<size_t>(k.n_entries * c.head_dim * 2),
                                 cudaMemcpyDeviceToDevice, stream),
                 "state grow");
      if (keys.get() != nullptr)
        check_cuda(cudaMemcpyAsync(keys.get(), k.index_keys.get(), static_cast<size_t>(k.n_entries * c.index_head_dim * 2),
                                   cudaMemcpyDeviceToDevice, stream),
                   "state grow");
    }
    k.compressed = compressed;
    k.index_keys = keys;
    k.capacity = n;
  }
  st.growing = std::move(grown);  // the old block goes back to its resource after the copies
  st.capacity_tokens = capacity_tokens;
}

CudaSeqState& Impl::state_of(SeqState& s) const {
  auto* p = dynamic_cast<CudaSeqState*>(&s);
  DSV_CHECK(p != nullptr, "sequence state does not belong to the CUDA model");
  DSV_CHECK(p->owner == this, "sequence state was made by a different model");
  return *p;
}

}  // namespace dsv41::model::cuda
#endif
