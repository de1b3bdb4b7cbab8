// Public face of the CUDA model backend (include/dsv41/model/cuda_model.h). Without CUDA in the
// build, load() says so.
#include "dsv41/model/cuda_model.h"

#include "dsv41/common/error.h"

#if DSV41_HAS_CUDA
#include "cuda_model/cuda_impl.h"

namespace dsv41::model {

struct CudaModel::Impl : cuda::Impl {
  // Device memory of pooled states (the server's StatePool upstream); declared here so it is
  // destroyed before the base's stream.
  std::unique_ptr<cuda::StreamStateMemory> state_memory;
  // The scheduler runs the model from its own thread: the model's device must be current there.
  void use_device() const { ops::gpu::check_cuda(cudaSetDevice(opts.device), "cudaSetDevice"); }
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;
cuda::Impl& CudaModel::engine() const { return *impl_; }

std::unique_ptr<CudaModel> CudaModel::load(const std::string& dir, const CudaModelOptions& opts) {
  // Name the flag when there is no GPU to run on (driver missing or too old, none visible).
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("--device cuda: no usable CUDA device ({})", cudaGetErrorString(e));
  }
  if (opts.device < 0 || opts.device >= devices)
    fail("--device cuda: CUDA device {} is not visible ({} device(s); CUDA_VISIBLE_DEVICES, driver)", opts.device,
         devices);
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->load(dir);
  impl->state_memory = std::make_unique<cuda::StreamStateMemory>(opts.device, impl->stream);
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

const ModelConfig& CudaModel::config() const { return impl_->cfg; }
std::unique_ptr<SeqState> CudaModel::new_sequence() const {
  impl_->use_device();
  return impl_->make_state();
}
std::unique_ptr<SeqState> CudaModel::new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const {
  impl_->use_device();
  return impl_->make_state(&memory, capacity_tokens);
}
void CudaModel::reserve_sequence(SeqState& state, int64_t capacity_tokens) const {
  impl_->use_device();
  impl_->reserve_state(impl_->state_of(state), capacity_tokens);
}
int64_t CudaModel::state_bytes(int64_t capacity_tokens) const { return impl_->state_bytes(capacity_tokens); }
std::pmr::memory_resource& CudaModel::state_memory() const { return *impl_->state_memory; }
int64_t CudaModel::max_context() const { return impl_->max_context; }

CudaMemoryBreakdown CudaModel::memory() const { return impl_->memory_breakdown(); }
CudaPathStats CudaModel::path_stats() const { return impl_->path_stats; }

void CudaModel::set_cuda_graphs(bool on) {
  DSV_CHECK(!on || impl_->graphs, "CUDA graphs: not available under tensor parallelism");
  impl_->graphs_on = on;
}
bool CudaModel::cuda_graphs() const { return impl_->graphs_on; }
bool CudaModel::cuda_graphs_available() const { return impl_->graphs != nullptr; }
CudaGraphStats CudaModel::graph_stats() const { return impl_->graphs ? impl_->graphs->stats() : CudaGraphStats{}; }
void CudaModel::set_layer_timing(bool on) {
  impl_->layer_timing = on;
  impl_->layer_marked.clear();
}
std::vector<double> CudaModel::layer_times_ms() { return impl_->layer_times_ms(); }

void CudaModel::forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                                 std::vector<float>* logits, BlockDump* dump) {
  impl_->forward(impl_->state_of(state), tokens.data(), static_cast<int64_t>(tokens.size()), all_logits, logits, dump);
}

// One-token decode steps of distinct sequences run as batched passes (cuda_decode_batch.cpp).
void CudaModel::forward(std::span<ForwardItem> batch) {
  impl_->use_device();
  for (ForwardItem& it : batch) DSV_CHECK(it.state != nullptr, "forward: item without a sequence state");
  impl_->forward_items(batch);
}

}  // namespace dsv41::model

#else

namespace dsv41::model {

struct CudaModel::Impl {};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

std::unique_ptr<CudaModel> CudaModel::load(const std::string&, const CudaModelOptions&) {
  fail("--device cuda: this dsv41-serve was built without CUDA (configure with -DDSV41_CUDA=ON)");
}
const ModelConfig& CudaModel::config() const { fail("CUDA model: built without CUDA"); }
std::unique_ptr<SeqState> CudaModel::new_sequence() const { fail("CUDA model: built without CUDA"); }
std::unique_ptr<SeqState> CudaModel::new_sequence(std::pmr::memory_resource&, int64_t) const {
  fail("CUDA model: built without CUDA");
}
void CudaModel::reserve_sequence(SeqState&, int64_t) const { fail("CUDA model: built without CUDA"); }
int64_t CudaModel::state_bytes(int64_t) const { fail("CUDA model: built without CUDA"); }
std::pmr::memory_resource& CudaModel::state_memory() const { fail("CUDA model: built without CUDA"); }
int64_t CudaModel::max_context() const { return 0; }
CudaMemoryBreakdown CudaModel::memory() const { return {}; }
void CudaModel::set_cuda_graphs(bool) { fail("CUDA model: built without CUDA"); }
bool CudaModel::cuda_graphs() const { return false; }
bool CudaModel::cuda_graphs_available() const { return false; }
CudaGraphStats CudaModel::graph_stats() const { return {}; }
void CudaModel::set_layer_timing(bool) { fail("CUDA model: built without CUDA"); }
std::vector<double> CudaModel::layer_times_ms() { return {}; }
CudaPathStats CudaModel::path_stats() const { return {}; }
void CudaModel::forward_sequence(SeqState&, std::span<const int32_t>, bool, std::vector<float>*, BlockDump*) {
  fail("CUDA model: built without CUDA");
}
void CudaModel::forward(std::span<ForwardItem>) { fail("CUDA model: built without CUDA"); }

}  // namespace dsv41::model

#endif
