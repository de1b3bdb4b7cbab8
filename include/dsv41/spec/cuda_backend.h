// SpecBackend on the CUDA model backend (src/spec/cuda_backend.cpp): drafting for all speculating
// sequences in one batched drafter pass on the GPU, verification of each position as the one-token
// decode step it replaces (greedy speculation reproduces plain decoding bit for bit), and rollback
// by undoing the saved steps of the rejected positions (CudaModel::save_step / undo_step).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "dsv41/model/cuda_model.h"
#include "dsv41/spec/spec_backend.h"

namespace dsv41::spec {

class CudaSpecBackend final : public SpecBackend {
 public:
  // The model must outlive the backend and must have been loaded with its DSpark stages.
  explicit CudaSpecBackend(model::CudaModel& model);

  int64_t block_size() const override;
  void draft(std::span<DraftItem> items) override;
  void forward(std::span<ForwardItem> batch, std::span<const uint8_t> verify) override;
  void rollback(SeqState& state, int64_t keep) override;
  void release(const SeqState& state) override;

  // Wall-clock seconds of the last draft() and forward() calls (both return with their results on
  // the host, so this is their whole cost; for benchmarks).
  double last_draft_seconds() const { return last_draft_s_; }
  double last_forward_seconds() const { return last_forward_s_; }

 private:
  struct Saved {
    std::vector<model::CudaStepUndo> steps;  // steps[i]: the state before verify position i+1 (reused)
    int64_t used = 0;                        // saved in the current step
    bool verified = false;                   // a verify forward ran in the current step
  };
  model::CudaModel& m_;
  std::unordered_map<const SeqState*, Saved> saved_;
  double last_draft_s_ = 0.0, last_forward_s_ = 0.0;
};

std::unique_ptr<CudaSpecBackend> make_cuda_spec_backend(model::CudaModel& model);

}  // namespace dsv41::spec
