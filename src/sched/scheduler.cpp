#include "sched/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "dsv41/common/error.h"

namespace dsv41::sched {

struct Scheduler::Sequence {
  uint64_t arrival = 0;
  GenerationRequest req;
  std::shared_ptr<TokenChannel> ch;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> tokens;  // prompt + generated; the last generated one is not fed yet
  int64_t n_generated = 0;
  int64_t n_fed = 0;            // tokens already inside `state`
  std::unique_ptr<SeqState> state;
  int64_t blocks = 0;           // pool blocks held
  std::vector<float> logits;
  int64_t chunk = 0;            // tokens fed in the step being built
};

Scheduler::Scheduler(Model& model, const SchedulerOptions& o)
    : model_(model),
      opt_(o),
      bytes_(state_bytes(model.config())),
      pool_(static_cast<int64_t>(o.kv_cache_gib * 1024.0 * 1024.0 * 1024.0), bytes_.packed_per_token,
            bytes_.packed_fixed, o.block_tokens) {
  const auto& c = model.config();
  if (opt_.max_model_len <= 0) opt_.max_model_len = c.max_position_embeddings;
  DSV_CHECK(opt_.max_model_len <= c.max_position_embeddings,
            "--max-model-len {} is over the model's max_position_embeddings {}", opt_.max_model_len,
            c.max_position_embeddings);
  DSV_CHECK(opt_.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
  DSV_CHECK(opt_.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be at least 1");
  DSV_CHECK(pool_.total_blocks() > pool_.fixed_blocks(),
            "--kv-cache-gib {} is too small: one sequence's fixed state alone needs {} bytes", opt_.kv_cache_gib,
            bytes_.packed_fixed);
  stats_.total_blocks = stats_.free_blocks = pool_.total_blocks();
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Nothing runs any more: close whatever is left.
  for (auto& s : running_) finish(*s, FinishReason::abort, "server shutting down");
  for (auto& s : waiting_) finish(*s, FinishReason::abort, "server shutting down");
  std::lock_guard lk(mu_);
  for (auto& s : inbox_) s->ch->finish(FinishReason::abort, "server shutting down");
  inbox_.clear();
  running_.clear();
  waiting_.clear();
}

std::shared_ptr<TokenChannel> Scheduler::submit(GenerationRequest r) {
  const auto& c = model_.config();
  DSV_CHECK(!r.prompt.empty(), "the prompt is empty");
  for (int32_t id : r.prompt)
    DSV_CHECK(id >= 0 && id < c.vocab_size, "token id {} is outside the vocabulary (0..{})", id, c.vocab_size - 1);
  DSV_CHECK(r.max_tokens >= 1, "max_tokens must be at least 1");
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  DSV_CHECK(need <= opt_.max_model_len,
            "this model's maximum context length is {} tokens; the request needs {} ({} in the prompt + {} to "
            "generate)",
            opt_.max_model_len, need, r.prompt.size(), r.max_tokens);
  DSV_CHECK(pool_.blocks_for(need) <= pool_.total_blocks(),
            "the request needs {} tokens of sequence state but the pool (--kv-cache-gib) holds {}", need,
            pool_.capacity_tokens());

  auto s = std::make_unique<Sequence>();
  s->ch = std::make_shared<TokenChannel>(static_cast<int64_t>(r.prompt.size()));
  s->sampler = std::make_unique<Sampler>(r.sampling, r.prompt);
  s->tokens = r.prompt;
  s->req = std::move(r);
  auto ch = s->ch;
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw Overloaded("the server is shutting down");
    if (!stats_.healthy) throw Overloaded("the engine has failed");
    if (stats_.waiting + static_cast<int64_t>(inbox_.size()) >= opt_.max_waiting)
      throw Overloaded("too many requests are waiting");
    s->arrival = next_arrival_++;
    ch->on_cancel_ = [this] {
      {
        std::lock_guard lk2(mu_);
        wake_ = true;
      }
      cv_.notify_all();
    };
    inbox_.push_back(std::move(s));
  }
  cv_.notify_all();
  return ch;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock lk(mu_);
      if (running_.empty() && waiting_.empty())
        cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || wake_; });
      if (stopping_) return;
      wake_ = false;
      for (auto& s : inbox_) waiting_.push_back(std::move(s));
      inbox_.clear();
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failure outside forward (allocation of a state, sampling): fail what runs, keep serving.
      spdlog::error("scheduler step failed: {}", e.what());
      for (auto& s : running_) finish(*s, FinishReason::error, "internal error");
      running_.clear();
    }
  }
}

void Scheduler::drop(Sequence& s) {
  s.state.reset();
  pool_.give_back(s.blocks);
  s.blocks = 0;
  s.n_fed = 0;
}

void Scheduler::finish(Sequence& s, FinishReason r, const std::string& err) {
  drop(s);
  s.ch->finish(r, err);
  std::lock_guard lk(mu_);
  switch (r) {
    case FinishReason::stop: ++stats_.finished_stop; break;
    case FinishReason::length: ++stats_.finished_length; break;
    case FinishReason::abort: ++stats_.finished_abort; break;
    case FinishReason::error: ++stats_.finished_error; break;
    case FinishReason::none: break;
  }
}

bool Scheduler::grow(Sequence& s, int64_t tokens) {
  const int64_t need = pool_.blocks_for(tokens) - s.blocks;
  if (need <= 0) return true;
  if (!pool_.try_take(need)) return false;
  s.blocks += need;
  return true;
}

// Recompute preemption: the youngest running sequence (other than `keep`) loses its state and
// goes back to the waiting queue in arrival order; its output so far is kept and re-fed later.
bool Scheduler::preempt_youngest_other(const Sequence* keep) {
  auto it = std::max_element(running_.begin(), running_.end(), [&](const auto& a, const auto& b) {
    if (a.get() == keep) return true;
    if (b.get() == keep) return false;
    return a->arrival < b->arrival;
  });
  if (it == running_.end() || it->get() == keep) return false;
  std::unique_ptr<Sequence> victim = std::move(*it);
  running_.erase(it);
  drop(*victim);
  victim->chunk = 0;
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](const auto& w) { return w->arrival > victim->arrival; });
  waiting_.insert(pos, std::move(victim));
  std::lock_guard lk(mu_);
  ++stats_.preemptions_total;
  return true;
}

bool Scheduler::step() {
  // 1. Cancelled sequences leave now (their state is freed before the next forward).
  auto cancelled = [&](std::unique_ptr<Sequence>& s) {
    if (!s->ch->cancelled()) return false;
    finish(*s, FinishReason::abort);
    return true;
  };
  std::erase_if(running_, cancelled);
  std::erase_if(waiting_, cancelled);

  // 2. Plan: decode every running sequence, then prefill chunks, then admit FCFS.
  int64_t budget = opt_.max_num_batched_tokens;
  std::sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  for (auto& s : running_) s->chunk = 0;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_fed;
    if (remaining != 1) continue;
    bool ok = grow(*s, s->n_fed + 1);
    while (!ok && preempt_youngest_other(s)) ok = grow(*s, s->n_fed + 1);
    if (!ok) continue;  // cannot happen: submit() checked a lone sequence fits
    s->chunk = 1;
    --budget;
  }
  for (auto& s : running_) {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_fed;
    if (remaining <= 1 || budget <= 0) continue;
    s->chunk = std::min(remaining, budget);
    budget -= s->chunk;
  }
  while (budget > 0 && !waiting_.empty() && static_cast<int64_t>(running_.size()) < opt_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    // The whole prompt (plus re-fed output after a preemption) is reserved at admission.
    if (!grow(s, static_cast<int64_t>(s.tokens.size()))) break;
    s.state = model_.new_sequence();
    // Everything fed before the first sample is one prompt (after a preemption: prompt + output),
    // so the engine lays the chunks out as one prefill of that length.
    s.state->prompt_len = static_cast<int64_t>(s.tokens.size());
    s.n_fed = 0;
    s.chunk = std::min(static_cast<int64_t>(s.tokens.size()), budget);
    budget -= s.chunk;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }

  std::vector<ForwardItem> batch;
  std::vector<Sequence*> members;
  int64_t step_tokens = 0;
  for (auto& s : running_) {
    if (s->chunk == 0) continue;
    ForwardItem it;
    it.state = s->state.get();
    it.tokens = std::span<const int32_t>(s->tokens.data() + s->n_fed, static_cast<size_t>(s->chunk));
    it.logits = &s->logits;
    batch.push_back(it);
    members.push_back(s.get());
    step_tokens += s->chunk;
  }
  auto publish = [&] {
    std::lock_guard lk(mu_);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.free_blocks = pool_.free_blocks();
    stats_.kv_usage = pool_.usage();
    int64_t live = 0;
    for (auto& s : running_) live += s->state != nullptr;
    stats_.live_states = live;
  };
  if (batch.empty()) {
    publish();
    return false;
  }

  // 3. Forward. A throwing batch leaves its states unspecified: fail those sequences.
  try {
    model_.forward(batch);
  } catch (const std::exception& e) {
    spdlog::error("forward failed for a batch of {} sequences: {}", batch.size(), e.what());
    for (Sequence* s : members) finish(*s, FinishReason::error, "internal error");
    std::erase_if(running_, [](const auto& s) { return s->ch->finish_reason() != FinishReason::none; });
    publish();
    return true;
  }

  // 4. Sample where a sequence has consumed everything it had.
  const auto& cfg = model_.config();
  const int32_t eos = static_cast<int32_t>(cfg.eos_token_id);
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);
  int64_t new_tokens = 0, prompt_tokens = 0;
  for (Sequence* s : members) {
    const bool first_pass = s->n_generated == 0;
    s->n_fed += s->chunk;
    if (first_pass) prompt_tokens += s->chunk;
    if (s->n_fed < static_cast<int64_t>(s->tokens.size())) continue;
    DSV_ASSERT(s->logits.size() >= vocab, "forward returned {} logits, vocab is {}", s->logits.size(), vocab);
    std::span<const float> row(s->logits.data() + (s->logits.size() - vocab), vocab);
    std::vector<int32_t> banned;
    if (s->n_generated < s->req.min_tokens) {
      if (!s->req.ignore_eos) banned.push_back(eos);
      banned.insert(banned.end(), s->req.stop_token_ids.begin(), s->req.stop_token_ids.end());
    }
    SampledToken t = s->sampler->sample(row, banned);
    ++s->n_generated;
    ++new_tokens;
    const bool is_eos = t.id == eos && !s->req.ignore_eos;
    const bool is_stop_id =
        std::find(s->req.stop_token_ids.begin(), s->req.stop_token_ids.end(), t.id) != s->req.stop_token_ids.end();
    if (is_eos || is_stop_id) {
      finish(*s, FinishReason::stop);
      continue;
    }
    s->tokens.push_back(t.id);
    s->ch->push(t);
    if (s->n_generated >= s->req.max_tokens || static_cast<int64_t>(s->tokens.size()) >= opt_.max_model_len)
      finish(*s, FinishReason::length);
  }
  std::erase_if(running_, [](const auto& s) { return s->ch->finish_reason() != FinishReason::none; });
  {
    std::lock_guard lk(mu_);
    stats_.prompt_tokens_total += prompt_tokens;
    stats_.generation_tokens_total += new_tokens;
    ++stats_.iterations_total;
    stats_.iteration_tokens_total += step_tokens;
  }
  publish();
  return true;
}

}  // namespace dsv41::sched
