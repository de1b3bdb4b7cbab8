// Public face of the CUDA model backend (include/dsv41/model/cuda_model.h). Without CUDA in the
// build, load() says so.
#include "dsv41/model/cuda_model.h"

#include "dsv41/common/error.h"

#if DSV41_HAS_CUDA
#include "cuda_model/cuda_impl.h"

namespace dsv41::model {

struct CudaModel::Impl : cuda::Impl {};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

std::unique_ptr<CudaModel> CudaModel::load(const std::string& dir, const CudaModelOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->load(dir);
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

const ModelConfig& CudaModel::config() const { return impl_->cfg; }
std::unique_ptr<SeqState> CudaModel::new_sequence() const { return impl_->make_state(); }
int64_t CudaModel::max_context() const { return impl_->max_context; }

CudaMemoryBreakdown CudaModel::memory() const {
  return {impl_->weight_bytes, impl_->state_bytes(), static_cast<int64_t>(impl_->sc.arena.bytes())};
}

void CudaModel::forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                                 std::vector<float>* logits, BlockDump* dump) {
  impl_->forward(impl_->state_of(state), tokens.data(), static_cast<int64_t>(tokens.size()), all_logits, logits, dump);
}

void CudaModel::forward(std::span<ForwardItem> batch) {
  for (ForwardItem& it : batch) {
    DSV_CHECK(it.state != nullptr, "forward: item without a sequence state");
    forward_sequence(*it.state, it.tokens, it.all_logits, it.logits);
  }
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
int64_t CudaModel::max_context() const { return 0; }
CudaMemoryBreakdown CudaModel::memory() const { return {}; }
void CudaModel::forward_sequence(SeqState&, std::span<const int32_t>, bool, std::vector<float>*, BlockDump*) {
  fail("CUDA model: built without CUDA");
}
void CudaModel::forward(std::span<ForwardItem>) { fail("CUDA model: built without CUDA"); }

}  // namespace dsv41::model

#endif
