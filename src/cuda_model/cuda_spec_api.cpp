// CudaModel's DSpark and speculative-verification API (include/dsv41/model/cuda_model.h): drafting
// (cuda_dspark.cpp) and the per-step undo of a sequence state.
//
// A one-token step at position p overwrites exactly: every layer's window-ring slot p mod window,
// the ratio > 1 compressor carries, the compressed-entry and index-key counts (rows past the count
// are never read), the index-key publisher, the Engram n-gram history, every DSpark ring's slot
// p mod window, and n_past. save_step copies those (the device pieces into one device buffer, on
// the model's stream); undo_step writes them back. Undoing saved steps in reverse order therefore
// restores the state bit for bit, whatever the steps wrote — a speculative verify of k+1 positions
// is rolled back to `keep` positions by undoing the saves taken before positions keep .. k.
#include "dsv41/model/cuda_model.h"

#include "dsv41/common/error.h"

#if DSV41_HAS_CUDA
#include "cuda_model/cuda_dspark.h"
#include "cuda_model/cuda_impl.h"

namespace dsv41::model {

struct CudaStepUndo::Data {
  ops::gpu::DeviceBuffer blob;
  const void* owner = nullptr;
  int64_t n_past = 0, last_key_publisher = -1;
  std::vector<int64_t> n_entries;       // [layer]
  std::vector<int64_t> engram_history;
};

CudaStepUndo::CudaStepUndo() = default;
CudaStepUndo::~CudaStepUndo() = default;
CudaStepUndo::CudaStepUndo(CudaStepUndo&&) noexcept = default;
CudaStepUndo& CudaStepUndo::operator=(CudaStepUndo&&) noexcept = default;

namespace {

void use_device(const cuda::Impl& m) { ops::gpu::check_cuda(cudaSetDevice(m.opts.device), "cudaSetDevice"); }

// Calls f(device piece, bytes) for every device piece a one-token step at st.n_past overwrites, in
// a fixed order (the blob's layout).
template <class F>
void for_each_step_piece(const cuda::Impl& m, const cuda::CudaSeqState& st, F&& f) {
  const ModelConfig& c = m.cfg;
  const int64_t row = c.head_dim * 2, slot = st.n_past % c.sliding_window;
  for (const cuda::StateSpan& r : st.ring) f(static_cast<uint8_t*>(r.get()) + slot * row, row);
  for (const cuda::GpuKvSource& k : st.kv) {
    if (k.carry_kv.get() == nullptr) continue;
    f(k.carry_kv.get(), static_cast<int64_t>(k.carry_kv.bytes()));
    f(k.carry_score.get(), static_cast<int64_t>(k.carry_score.bytes()));
  }
  for (const cuda::StateSpan& r : st.dspark.ring) f(static_cast<uint8_t*>(r.get()) + slot * row, row);
}

}  // namespace

bool CudaModel::has_dspark() const { return engine().dspark != nullptr; }

DsparkDraft CudaModel::dspark_draft(const SeqState& state, int32_t anchor) {
  const SeqState* s = &state;
  return dspark_draft_batch(std::span<const SeqState* const>(&s, 1), std::span<const int32_t>(&anchor, 1)).front();
}

std::vector<DsparkDraft> CudaModel::dspark_draft_batch(std::span<const SeqState* const> states,
                                                       std::span<const int32_t> anchors) {
  cuda::Impl& m = engine();
  use_device(m);
  std::vector<cuda::CudaSeqState*> seqs;
  seqs.reserve(states.size());
  for (const SeqState* s : states) {
    DSV_CHECK(s != nullptr, "DSpark draft: null sequence state");
    seqs.push_back(&m.state_of(const_cast<SeqState&>(*s)));  // the draft only reads the state
  }
  return cuda::dspark_draft(m, seqs, anchors);
}

void CudaModel::save_step(const SeqState& state, CudaStepUndo& into) {
  cuda::Impl& m = engine();
  use_device(m);
  const cuda::CudaSeqState& st = m.state_of(const_cast<SeqState&>(state));
  if (!into.d_) into.d_ = std::make_unique<CudaStepUndo::Data>();
  CudaStepUndo::Data& d = *into.d_;
  int64_t bytes = 0;
  for_each_step_piece(m, st, [&](void*, int64_t n) { bytes += n; });
  if (static_cast<int64_t>(d.blob.bytes()) < bytes) d.blob = ops::gpu::DeviceBuffer(static_cast<size_t>(bytes));
  int64_t off = 0;
  for_each_step_piece(m, st, [&](void* p, int64_t n) {
    ops::gpu::check_cuda(cudaMemcpyAsync(d.blob.as<uint8_t>() + off, p, static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                                         m.stream),
                         "save step");
    off += n;
  });
  d.owner = &st;
  d.n_past = st.n_past;
  d.last_key_publisher = st.last_key_publisher;
  d.n_entries.clear();
  for (const cuda::GpuKvSource& k : st.kv) d.n_entries.push_back(k.n_entries);
  d.engram_history = st.engram_history;
}

void CudaModel::undo_step(SeqState& state, const CudaStepUndo& saved) {
  cuda::Impl& m = engine();
  use_device(m);
  cuda::CudaSeqState& st = m.state_of(state);
  DSV_CHECK(saved.d_ && saved.d_->owner == &st, "undo_step: the saved step belongs to another sequence state");
  const CudaStepUndo::Data& d = *saved.d_;
  DSV_CHECK(st.n_past >= d.n_past, "undo_step: the state is at position {}, before the saved position {}", st.n_past,
            d.n_past);
  st.n_past = d.n_past;  // the pieces are addressed by the saved position's slot
  int64_t off = 0;
  for_each_step_piece(m, st, [&](void* p, int64_t n) {
    ops::gpu::check_cuda(cudaMemcpyAsync(p, d.blob.as<uint8_t>() + off, static_cast<size_t>(n), cudaMemcpyDeviceToDevice,
                                         m.stream),
                         "undo step");
    off += n;
  });
  st.last_key_publisher = d.last_key_publisher;
  for (size_t l = 0; l < st.kv.size() && l < d.n_entries.size(); ++l) st.kv[l].n_entries = d.n_entries[l];
  // The pooled state reserved the history's room once; assigning keeps it (never above max_ngram-1).
  st.engram_history.assign(d.engram_history.begin(), d.engram_history.end());
}

}  // namespace dsv41::model

#else

namespace dsv41::model {

struct CudaStepUndo::Data {};
CudaStepUndo::CudaStepUndo() = default;
CudaStepUndo::~CudaStepUndo() = default;
CudaStepUndo::CudaStepUndo(CudaStepUndo&&) noexcept = default;
CudaStepUndo& CudaStepUndo::operator=(CudaStepUndo&&) noexcept = default;

bool CudaModel::has_dspark() const { return false; }
DsparkDraft CudaModel::dspark_draft(const SeqState&, int32_t) { fail("CUDA model: built without CUDA"); }
std::vector<DsparkDraft> CudaModel::dspark_draft_batch(std::span<const SeqState* const>, std::span<const int32_t>) {
  fail("CUDA model: built without CUDA");
}
void CudaModel::save_step(const SeqState&, CudaStepUndo&) { fail("CUDA model: built without CUDA"); }
void CudaModel::undo_step(SeqState&, const CudaStepUndo&) { fail("CUDA model: built without CUDA"); }

}  // namespace dsv41::model

#endif
