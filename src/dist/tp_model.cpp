// Rank 0's tensor-parallel model: wraps the local CpuModel or CudaModel share, and before every
// collective step sends the step's plan so the workers run the same operations on their mirrored
// states.
#include <spdlog/spdlog.h>

#include <chrono>

#include "dist/nccl_collective.h"
#include "dist/tp_head.h"
#include "dsv41/dist/tp_runtime.h"

namespace dsv41::dist {
namespace {

PlanOp seq_op(OpKind kind, uint64_t seq, uint64_t seq2 = 0) {
  PlanOp op;
  op.kind = kind;
  op.seq = seq;
  op.seq2 = seq2;
  return op;
}

// Ops that change worker-side sequences outside forward (free, clone, restore) wait here for the
// next plan; they are dropped when the epoch changes (the workers' states are gone then).
struct PendingOps {
  std::mutex mu;
  uint64_t epoch = 0;
  std::vector<PlanOp> ops;
};

struct TpSeqState final : SeqState {
  std::unique_ptr<SeqState> local;
  uint64_t id = 0;
  bool remote = false;  // created on the workers (in `epoch`)
  uint64_t epoch = 0;
  std::shared_ptr<PendingOps> pending;
  ~TpSeqState() override {
    if (!remote || !pending) return;
    std::lock_guard lk(pending->mu);
    if (pending->epoch == epoch) pending->ops.push_back(seq_op(OpKind::free_seq, id));
  }
};

TpSeqState& tp_state(SeqState& s) {
  auto* p = dynamic_cast<TpSeqState*>(&s);
  DSV_CHECK(p != nullptr, "sequence state does not belong to the tensor-parallel model");
  return *p;
}
const TpSeqState& tp_state(const SeqState& s) { return tp_state(const_cast<SeqState&>(s)); }

}  // namespace

struct TpModel::Impl {
  TpHeadOptions opt;
  std::shared_ptr<TcpCollective> tcp;
  std::unique_ptr<model::CpuModel> cpu;    // the CPU path's share (TCP collective), or
  std::shared_ptr<Collective> nccl;         // the CUDA path's collective and
  std::unique_ptr<model::CudaModel> cuda;   // share (CudaModelOptions::tp)
  std::shared_ptr<PendingOps> pending = std::make_shared<PendingOps>();
  std::mutex exec_mu;  // one step at a time
  mutable std::atomic<uint64_t> next_id{1};
  uint64_t step = 0;
  std::unique_ptr<TpHead> head;  // last: destroyed first (tells the workers before the model goes)

  Model& local() const { return cuda ? static_cast<Model&>(*cuda) : static_cast<Model&>(*cpu); }
  // The CPU engine's extras (state clones, DSpark drafts); the CUDA path has none yet.
  model::CpuModel& cpu_only(const char* what) const {
    DSV_CHECK(cpu != nullptr, "{} is not available with the CUDA backend at --world-size > 1 (use --device cpu)",
              what);
    return *cpu;
  }

  std::unique_ptr<SeqState> wrap(std::unique_ptr<SeqState> local) const {
    auto s = std::make_unique<TpSeqState>();
    s->local = std::move(local);
    s->id = next_id++;
    s->pending = pending;
    return s;
  }

  // Starts a step: a usable epoch (or RankLost), every sequence of the step from this epoch (or
  // TpUnavailable, before anything is consumed), then the queued ops (stale ones dropped).
  Plan begin_step(std::span<const TpSeqState* const> seqs) {
    const uint64_t ep = head->ensure_epoch();
    for (const TpSeqState* s : seqs)
      if (s->remote && s->epoch != ep)
        throw TpUnavailable(fmt::format(
            "tensor-parallel worker restarted: this sequence was started before it rejoined (epoch {}, now {}) and "
            "its state on that rank is gone; retry the request",
            s->epoch, ep));
    Plan p;
    p.step = ++step;
    std::lock_guard lk(pending->mu);
    if (pending->epoch != ep) {
      pending->ops.clear();
      pending->epoch = ep;
    }
    p.ops = std::move(pending->ops);
    pending->ops.clear();
    return p;
  }

  // Makes sure `s` exists on the workers in the current epoch (adds NEW to the plan if needed).
  void join(TpSeqState& s, Plan& p) {
    const uint64_t ep = head->epoch();
    DSV_ASSERT(!s.remote || s.epoch == ep, "sequence {} from epoch {} in epoch {}", s.id, s.epoch, ep);
    if (!s.remote) {
      DSV_CHECK(s.local->n_past == 0, "sequence {} has {} tokens on rank 0 but none on the workers", s.id,
                s.local->n_past);
      p.ops.push_back(seq_op(OpKind::new_seq, s.id));
      s.remote = true;
      s.epoch = ep;
    }
  }

  void check_tokens(const SeqState& st, std::span<const int32_t> tokens) const {
    const ModelConfig& c = local().config();
    DSV_CHECK(!tokens.empty(), "forward: no tokens");
    for (size_t i = 0; i < tokens.size(); ++i)
      DSV_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size,
                "token id {} at position {} is outside the vocabulary [0, {})", tokens[i],
                st.n_past + static_cast<int64_t>(i), c.vocab_size);
    DSV_CHECK(st.n_past + static_cast<int64_t>(tokens.size()) <= c.max_position_embeddings,
              "sequence of {} tokens exceeds the configured context (max_position_embeddings = {})",
              st.n_past + static_cast<int64_t>(tokens.size()), c.max_position_embeddings);
  }

  // Runs the local side of a plan already sent; any failure other than a lost rank leaves the
  // workers out of step, so the epoch is abandoned (they rejoin).
  template <class F>
  auto run_local(F&& f) {
    try {
      return f();
    } catch (const RankLost&) {
      throw;
    } catch (const std::exception& e) {
      head->break_epoch(0, e.what());
      throw;
    }
  }

  void forward_items(std::span<ForwardItem> batch, model::BlockDump* dump) {
    std::lock_guard lk(exec_mu);
    for (ForwardItem& it : batch) {
      DSV_CHECK(it.state != nullptr, "forward: item without a sequence state");
      check_tokens(*it.state, it.tokens);
    }
    std::vector<const TpSeqState*> seqs;
    for (ForwardItem& it : batch) seqs.push_back(&tp_state(*it.state));
    Plan p = begin_step(seqs);
    // Every sequence op first, then the forwards side by side: a CUDA worker runs a plan's run of
    // consecutive forwards as one batch, as this rank does with `batch`.
    for (ForwardItem& it : batch) join(tp_state(*it.state), p);
    for (ForwardItem& it : batch) {
      TpSeqState& s = tp_state(*it.state);
      PlanOp op;
      op.kind = OpKind::forward;
      op.seq = s.id;
      op.n_past = s.n_past;
      op.prompt_len = s.prompt_len;
      op.all_logits = it.all_logits;
      op.want_logits = it.logits != nullptr;
      op.tokens.assign(it.tokens.begin(), it.tokens.end());
      p.ops.push_back(std::move(op));
    }
    head->send_plan(p);
    run_local([&] {
      for (ForwardItem& it : batch) {
        TpSeqState& s = tp_state(*it.state);
        s.local->prompt_len = s.prompt_len;
      }
      if (cuda && !dump) {
        // The CUDA engine runs the items' one-token decode steps as one pass (every weight read
        // once for all of them); the workers hand it the same items in the same order
        // (tp_worker.cpp), so every rank groups them alike and makes the same collectives.
        std::vector<ForwardItem> local(batch.begin(), batch.end());
        for (ForwardItem& it : local) it.state = tp_state(*it.state).local.get();
        cuda->forward(local);
      } else {
        for (ForwardItem& it : batch) {
          TpSeqState& s = tp_state(*it.state);
          if (cuda) cuda->forward_sequence(*s.local, it.tokens, it.all_logits, it.logits, dump);
          else cpu->forward_sequence(*s.local, it.tokens, it.all_logits, it.logits, dump);
        }
      }
      for (ForwardItem& it : batch) {
        TpSeqState& s = tp_state(*it.state);
        s.n_past = s.local->n_past;
      }
      return 0;
    });
  }
};

TpModel::TpModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TpModel::~TpModel() {
  if (impl_) impl_->head.reset();
}

std::unique_ptr<TpModel> TpModel::start(const TpHeadOptions& o, model::CpuModelOptions mo) {
  DSV_CHECK(o.world_size >= 2, "tensor parallel needs --world-size >= 2");
  auto impl = std::make_unique<Impl>();
  impl->opt = o;
  const Identity id = compute_identity(o.model_dir, mo.engram_token_map);
  impl->tcp = std::make_shared<TcpCollective>(0, o.world_size);
  impl->head = std::make_unique<TpHead>(o, id, impl->tcp);
  mo.tp = impl->tcp;
  mo.dspark = o.run.dspark;
  mo.corrected_index_keys = o.run.corrected_index_keys;
  impl->cpu = model::CpuModel::load(o.model_dir, mo);
  return std::unique_ptr<TpModel>(new TpModel(std::move(impl)));
}

std::unique_ptr<TpModel> TpModel::start_cuda(const TpHeadOptions& o_in, model::CudaModelOptions mo) {
#if defined(DSV41_HAS_NCCL)
  DSV_CHECK(o_in.world_size >= 2, "tensor parallel needs --world-size >= 2");
  TpHeadOptions o = o_in;
  o.run.nccl_id = nccl_unique_id();  // travels in WELCOME
  auto impl = std::make_unique<Impl>();
  impl->opt = o;
  const Identity id = compute_identity(o.model_dir, mo.engram_token_map);
  impl->tcp = std::make_shared<TcpCollective>(0, o.world_size);
  impl->head = std::make_unique<TpHead>(o, id, impl->tcp);
  // The communicator forms when every worker has joined (after its WELCOME): until then only a
  // deadline ends the wait; afterwards a dead rank (heartbeats) aborts any collective.
  static constexpr double kInitTimeoutS = 1800.0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kInitTimeoutS);
  auto formed = std::make_shared<std::atomic<bool>>(false);
  TpHead* head = impl->head.get();
  spdlog::info("tensor parallel: waiting for {} worker rank(s) to join the NCCL communicator", o.world_size - 1);
  impl->nccl = make_nccl_collective(0, o.world_size, o.run.nccl_id, mo.device, [head, formed, deadline]() {
    if (formed->load()) return head->unavailable_reason();
    if (std::string why = head->load_failure(); !why.empty()) return "a worker cannot take part: " + why;
    if (std::chrono::steady_clock::now() > deadline)
      return fmt::format("no worker joined the NCCL communicator within {:.0f} s", kInitTimeoutS);
    return std::string();
  });
  formed->store(true);
  mo.tp = impl->nccl;
  mo.dspark = o.run.dspark;
  mo.corrected_index_keys = o.run.corrected_index_keys;
  impl->cuda = model::CudaModel::load(o.model_dir, mo);
  return std::unique_ptr<TpModel>(new TpModel(std::move(impl)));
#else
  (void)o_in;
  (void)mo;
  fail("--device cuda with --world-size > 1 needs a build with CUDA and NCCL (this one has none)");
#endif
}

void TpModel::wait_for_workers(double timeout_s) { impl_->head->wait_ready(timeout_s); }
std::string TpModel::unavailable_reason() const { return impl_->head->unavailable_reason(); }
CollectiveStats TpModel::collective_stats() const { return impl_->nccl ? impl_->nccl->stats() : impl_->tcp->stats(); }
const ModelConfig& TpModel::config() const { return impl_->local().config(); }
bool TpModel::has_dspark() const { return impl_->cpu ? impl_->cpu->has_dspark() : impl_->cuda->has_dspark(); }

std::unique_ptr<SeqState> TpModel::new_sequence() const { return impl_->wrap(impl_->local().new_sequence()); }

std::unique_ptr<SeqState> TpModel::new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const {
  return impl_->wrap(impl_->local().new_sequence(memory, capacity_tokens));
}

void TpModel::reserve_sequence(SeqState& state, int64_t capacity_tokens) const {
  impl_->local().reserve_sequence(*tp_state(state).local, capacity_tokens);
}

int64_t TpModel::state_bytes(int64_t capacity_tokens) const { return impl_->local().state_bytes(capacity_tokens); }

std::pmr::memory_resource& TpModel::state_memory() const { return impl_->local().state_memory(); }

void TpModel::forward(std::span<ForwardItem> batch) { impl_->forward_items(batch, nullptr); }

void TpModel::forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits,
                               std::vector<float>* logits, model::BlockDump* dump) {
  ForwardItem it;
  it.state = &state;
  it.tokens = tokens;
  it.all_logits = all_logits;
  it.logits = logits;
  impl_->forward_items(std::span<ForwardItem>(&it, 1), dump);
}

model::DsparkDraft TpModel::dspark_draft(const SeqState& state, int32_t anchor) {
  Impl& m = *impl_;
  std::lock_guard lk(m.exec_mu);
  TpSeqState& s = tp_state(const_cast<SeqState&>(state));
  model::CpuModel& cpu = m.cpu_only("DSpark drafting");
  const ModelConfig& c = cpu.config();
  DSV_CHECK(cpu.has_dspark(), "this model was loaded without DSpark stages");
  DSV_CHECK(s.local->n_past > 0, "DSpark needs at least one processed position");
  DSV_CHECK(anchor >= 0 && anchor < c.vocab_size, "DSpark anchor token {} outside the vocabulary", anchor);
  const TpSeqState* seqs[] = {&s};
  Plan p = m.begin_step(seqs);
  m.join(s, p);
  PlanOp op;
  op.kind = OpKind::draft;
  op.seq = s.id;
  op.n_past = s.local->n_past;
  op.anchor = anchor;
  p.ops.push_back(std::move(op));
  m.head->send_plan(p);
  return m.run_local([&] { return cpu.dspark_draft(*s.local, anchor); });
}

std::unique_ptr<SeqState> TpModel::clone_state(const SeqState& src_state) {
  Impl& m = *impl_;
  const TpSeqState& src = tp_state(src_state);
  auto out = m.wrap(m.cpu_only("cloning a sequence state").clone_state(*src.local));
  TpSeqState& dst = tp_state(*out);
  dst.n_past = src.n_past;
  dst.prompt_len = src.prompt_len;
  if (src.remote) {
    std::lock_guard lk(m.pending->mu);
    if (m.pending->epoch == src.epoch) {
      m.pending->ops.push_back(seq_op(OpKind::clone, src.id, dst.id));
      dst.remote = true;
      dst.epoch = src.epoch;
    } else {
      dst.remote = true;  // as stale as its source: using it fails cleanly
      dst.epoch = src.epoch;
    }
  }
  return out;
}

void TpModel::restore_state(SeqState& dst_state, const SeqState& src_state) {
  Impl& m = *impl_;
  TpSeqState& dst = tp_state(dst_state);
  const TpSeqState& src = tp_state(src_state);
  m.cpu_only("restoring a sequence state").restore_state(*dst.local, *src.local);
  dst.n_past = src.n_past;
  dst.prompt_len = src.prompt_len;
  std::lock_guard lk(m.pending->mu);
  if (dst.remote && dst.epoch == m.pending->epoch) {
    if (src.remote && src.epoch == dst.epoch) {
      m.pending->ops.push_back(seq_op(OpKind::restore, dst.id, src.id));
    } else {  // restoring a fresh state: drop the worker copy, it is re-created on the next step
      m.pending->ops.push_back(seq_op(OpKind::free_seq, dst.id));
      dst.remote = false;
    }
  } else if (!dst.remote && src.remote && src.epoch == m.pending->epoch) {
    m.pending->ops.push_back(seq_op(OpKind::new_seq, dst.id));
    m.pending->ops.push_back(seq_op(OpKind::restore, dst.id, src.id));
    dst.remote = true;
    dst.epoch = src.epoch;
  } else {
    dst.remote = src.remote;
    dst.epoch = src.epoch;
  }
}

}  // namespace dsv41::dist
