#include "sched/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "dsv41/dist/collective.h"
#include "dsv41/common/error.h"
#include "dsv41/common/parallel.h"
#include "spec/speculator.h"

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
  int64_t room = 0;             // context tokens the state has room for (whole pool blocks)
  std::vector<float> logits;
  int32_t device_pick = -1;     // the backend's greedy pick for this step (ForwardItem::greedy_id), or -1
  int64_t chunk = 0;            // tokens fed in the step being built
  spec::BanRule bans;           // EOS and stop ids while below min_tokens
  int64_t steps = 0;            // target steps that committed tokens (SampledToken::step)
  std::unique_ptr<spec::SeqSpeculator> spec;  // null: this sequence never speculates
  bool verifying = false;       // this step feeds [anchor, drafts] (chunk = 1 + drafts)
};

Scheduler::Scheduler(Model& model, const SchedulerOptions& o, spec::SpecBackend* spec)
    : model_(model),
      spec_(spec),
      opt_(o),
      bytes_(state_bytes(model.config())),
      pool_(static_cast<int64_t>(o.kv_cache_gib * 1024.0 * 1024.0 * 1024.0), o.block_tokens, &model.state_memory()) {
  const auto& c = model.config();
  if (opt_.max_model_len <= 0) opt_.max_model_len = c.max_position_embeddings;
  DSV_CHECK(opt_.max_model_len <= c.max_position_embeddings,
            "--max-model-len {} is over the model's max_position_embeddings {}", opt_.max_model_len,
            c.max_position_embeddings);
  DSV_CHECK(opt_.max_num_seqs >= 1, "--max-num-seqs must be at least 1");
  DSV_CHECK(opt_.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be at least 1");
  const int64_t one_block = model.state_bytes(pool_.room_for(1, opt_.max_model_len));
  DSV_CHECK(one_block <= pool_.capacity_bytes(),
            "--kv-cache-gib {} is too small: one sequence with room for {} tokens needs {} bytes", opt_.kv_cache_gib,
            pool_.room_for(1, opt_.max_model_len), one_block);
  // The longest context one sequence can have in the pool (state_bytes grows with the room).
  int64_t lo = 1, hi = opt_.max_model_len;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (model.state_bytes(mid) <= pool_.capacity_bytes()) lo = mid;
    else hi = mid - 1;
  }
  capacity_tokens_ = lo;
  stats_.pool_capacity_bytes = pool_.capacity_bytes();
  spec::validate(opt_.spec);
  DSV_CHECK(opt_.spec.method == spec::SpecMethod::none || spec_ != nullptr,
            "--spec-method {}: this engine has no speculative decoding backend", spec::spec_method_name(opt_.spec.method));
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
  DSV_CHECK(model_.state_bytes(pool_.room_for(need, opt_.max_model_len)) <= pool_.capacity_bytes(),
            "the request needs {} tokens of sequence state but the pool (--kv-cache-gib) holds {}", need,
            capacity_tokens_);

  auto s = std::make_unique<Sequence>();
  s->ch = std::make_shared<TokenChannel>(static_cast<int64_t>(r.prompt.size()));
  s->sampler = std::make_unique<Sampler>(r.sampling, r.prompt);
  s->tokens = r.prompt;
  s->bans.min_tokens = r.min_tokens;
  if (!r.ignore_eos) s->bans.ids.push_back(static_cast<int32_t>(c.eos_token_id));
  s->bans.ids.insert(s->bans.ids.end(), r.stop_token_ids.begin(), r.stop_token_ids.end());
  if (spec_ && opt_.spec.method != spec::SpecMethod::none && r.spec_tokens != 0) {
    spec::SpecOptions so = opt_.spec;
    if (r.spec_tokens > 0)
      so.max_draft_tokens = so.max_draft_tokens > 0 ? std::min(so.max_draft_tokens, r.spec_tokens) : r.spec_tokens;
    s->spec = std::make_unique<spec::SeqSpeculator>(so, spec_->block_size());
  }
  s->req = std::move(r);
  auto ch = s->ch;
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw Overloaded("the server is shutting down");
    if (!stats_.healthy) throw Overloaded("the engine has failed");
    if (stalled_) throw Overloaded("the engine is not making progress (" + stalled_reason_ + ")");
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
    std::erase_if(open_, [](const auto& w) { auto c = w.lock(); return !c || c->finish_reason() != FinishReason::none; });
    open_.push_back(ch);
    pending_.store(stats_.running + stats_.waiting + static_cast<int64_t>(inbox_.size()));
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
      if (step()) ++steps_done_;
      else if (!running_.empty() || !waiting_.empty()) {
        // Work is held back (memory gate): look again shortly instead of spinning.
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(20), [&] { return stopping_ || !inbox_.empty() || wake_; });
      }
    } catch (const std::exception& e) {
      // A failure outside forward (allocation of a state, sampling): fail what runs, keep serving.
      spdlog::error("scheduler step failed: {}", e.what());
      for (auto& s : running_) finish(*s, FinishReason::error, "internal error");
      running_.clear();
    }
  }
}

void Scheduler::drop(Sequence& s) {
  if (spec_ && s.state) spec_->release(*s.state);
  s.verifying = false;
  s.state.reset();  // its buffers go back to the pool
  s.room = 0;
  s.n_fed = 0;
}

void Scheduler::finish(Sequence& s, FinishReason r, const std::string& err) {
  drop(s);
  {  // counted before the client wakes, so that metrics read after a response include it
    std::lock_guard lk(mu_);
    switch (r) {
      case FinishReason::stop: ++stats_.finished_stop; break;
      case FinishReason::length: ++stats_.finished_length; break;
      case FinishReason::abort: ++stats_.finished_abort; break;
      case FinishReason::error: ++stats_.finished_error; break;
      case FinishReason::none: break;
    }
  }
  s.ch->finish(r, err);
}

// Gives a sequence room for `tokens` context tokens (whole blocks). With no state yet it is
// created in the pool; otherwise the engine enlarges its buffers there. False when the pool
// cannot take the extra bytes.
bool Scheduler::grow(Sequence& s, int64_t tokens) {
  if (s.state && tokens <= s.room) return true;
  const int64_t room = pool_.room_for(tokens, opt_.max_model_len);
  const int64_t extra = model_.state_bytes(room) - (s.state ? model_.state_bytes(s.room) : 0);
  if (!pool_.fits(extra)) return false;
  if (s.state) model_.reserve_sequence(*s.state, room);
  else s.state = model_.new_sequence(pool_, room);
  s.room = room;
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
  // 1. Cancelled sequences leave now (their state is freed before the next forward); so do
  // sequences whose request was already failed from outside (a stall).
  auto cancelled = [&](std::unique_ptr<Sequence>& s) {
    if (!s->ch->cancelled() && s->ch->finish_reason() == FinishReason::none) return false;
    finish(*s, FinishReason::abort);
    return true;
  };
  std::erase_if(running_, cancelled);
  std::erase_if(waiting_, cancelled);

  // Below the memory margin nothing new is admitted and prefill pauses (decode continues).
  const bool memory_ok = !opt_.memory_ok || opt_.memory_ok();
  // The memory watchdog asked for room: the youngest running sequence goes back to waiting
  // (a request that arrives after memory recovered is dropped).
  if (preempt_requested_.exchange(false) && !memory_ok) preempt_youngest_other(nullptr);

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
  plan_speculation(budget);
  for (auto& s : running_) {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_fed;
    if (remaining <= 1 || budget <= 0 || !memory_ok) continue;
    s->chunk = std::min(remaining, budget);
    budget -= s->chunk;
  }
  while (memory_ok && budget > 0 && !waiting_.empty() && static_cast<int64_t>(running_.size()) < opt_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    // The whole prompt (plus re-fed output after a preemption) is reserved at admission.
    if (!grow(s, static_cast<int64_t>(s.tokens.size()))) break;
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
  std::vector<uint8_t> verify;
  int64_t step_tokens = 0;
  for (auto& s : running_) {
    if (s->chunk == 0) continue;
    ForwardItem it;
    it.state = s->state.get();
    it.tokens = std::span<const int32_t>(s->tokens.data() + s->n_fed, static_cast<size_t>(s->chunk));
    if (s->verifying) {
      it.tokens = s->spec->verify_tokens();
      it.all_logits = true;
    }
    it.logits = &s->logits;
    // A sequence that samples after this chunk with a plain greedy pick lets the backend pick
    // where the logits are (a GPU then downloads one id instead of a vocabulary row).
    s->device_pick = -1;
    const bool samples = !s->verifying && s->n_fed + s->chunk >= static_cast<int64_t>(s->tokens.size());
    if (samples && s->sampler->raw_argmax(s->bans.at(s->n_generated))) it.greedy_id = &s->device_pick;
    verify.push_back(s->verifying ? 1 : 0);
    batch.push_back(it);
    members.push_back(s.get());
    step_tokens += s->chunk;
  }
  auto publish = [&] {
    std::lock_guard lk(mu_);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.pool_used_bytes = pool_.used_bytes();
    stats_.pool_peak_bytes = pool_.peak_bytes();
    stats_.kv_usage = pool_.usage();
    int64_t live = 0;
    for (auto& s : running_) live += s->state != nullptr;
    stats_.live_states = live;
    pending_.store(stats_.running + stats_.waiting + static_cast<int64_t>(inbox_.size()));
  };
  if (batch.empty()) {
    publish();
    return false;
  }

  // 3. Forward. A throwing batch leaves its states unspecified: fail those sequences.
  try {
    if (spec_) spec_->forward(batch, verify);
    else model_.forward(batch);
  } catch (const std::exception& e) {
    spdlog::error("forward failed for a batch of {} sequences: {}", batch.size(), e.what());
    // A tensor-parallel rank that is down is named to the client (503); anything else stays internal.
    const bool tp_down = dynamic_cast<const dist::TpUnavailable*>(&e) != nullptr;
    for (Sequence* s : members) finish(*s, FinishReason::error, tp_down ? e.what() : "internal error");
    std::erase_if(running_, [](const auto& s) { return s->ch->finish_reason() != FinishReason::none; });
    publish();
    return true;
  }

  // 4. Sample where a sequence has consumed everything it had.
  const auto& cfg = model_.config();
  const size_t vocab = static_cast<size_t>(cfg.vocab_size);
  // Prompt tokens are counted before any token of this step reaches a client (deliver counts
  // generated tokens one by one, before each push), so that metrics read after a response include it.
  int64_t prompt_tokens = 0;
  for (Sequence* s : members)
    if (!s->verifying && s->n_generated == 0) prompt_tokens += s->chunk;
  {
    std::lock_guard lk(mu_);
    stats_.prompt_tokens_total += prompt_tokens;
  }
  std::vector<Sequence*> sampling;
  for (Sequence* s : members) {
    if (s->verifying) {
      commit_verified(*s);
      continue;
    }
    s->n_fed += s->chunk;
    if (s->n_fed < static_cast<int64_t>(s->tokens.size())) continue;
    if (s->device_pick >= 0)
      DSV_ASSERT(s->device_pick < static_cast<int64_t>(vocab), "forward picked token {}, vocab is {}", s->device_pick, vocab);
    else
      DSV_ASSERT(s->logits.size() >= vocab, "forward returned {} logits, vocab is {}", s->logits.size(), vocab);
    sampling.push_back(s);
  }
  // Each sequence owns its sampler (RNG, counts), so rows can be sampled side by side; tokens are
  // delivered afterwards in batch order. A row alone spreads its sort and exps over the pool
  // (~2-3x faster than one thread at 129k entries, bench/RESULTS.md "Sampling"), so a thread per
  // row only pays from kRowsPerThread rows sampled on the host.
  constexpr int64_t kRowsPerThread = 3;
  std::vector<SampledToken> sampled(sampling.size());
  auto sample_rows = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      Sequence* s = sampling[static_cast<size_t>(i)];
      if (s->device_pick >= 0) {
        sampled[static_cast<size_t>(i)] = s->sampler->record(s->device_pick, {});
        continue;
      }
      std::span<const float> row(s->logits.data() + (s->logits.size() - vocab), vocab);
      sampled[static_cast<size_t>(i)] = s->sampler->sample(row, s->bans.at(s->n_generated));
    }
  };
  const auto host_rows = std::count_if(sampling.begin(), sampling.end(), [](const Sequence* s) { return s->device_pick < 0; });
  if (host_rows >= kRowsPerThread) parallel_for(static_cast<int64_t>(sampling.size()), sample_rows);
  else sample_rows(0, static_cast<int64_t>(sampling.size()));
  for (size_t i = 0; i < sampling.size(); ++i) {
    sampled[i].step = ++sampling[i]->steps;
    deliver(*sampling[i], std::move(sampled[i]));
  }
  std::erase_if(running_, [](const auto& s) { return s->ch->finish_reason() != FinishReason::none; });
  {
    std::lock_guard lk(mu_);
    ++stats_.iterations_total;
    stats_.iteration_tokens_total += step_tokens;
  }
  publish();
  return true;
}

bool Scheduler::deliver(Sequence& s, SampledToken t) {
  const int32_t eos = static_cast<int32_t>(model_.config().eos_token_id);
  ++s.n_generated;
  {
    std::lock_guard lk(mu_);
    ++stats_.generation_tokens_total;
  }
  const bool is_eos = t.id == eos && !s.req.ignore_eos;
  const bool is_stop_id =
      std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), t.id) != s.req.stop_token_ids.end();
  if (is_eos || is_stop_id) {
    // The ending token was generated: it is delivered (counted in usage like OpenAI/vLLM do,
    // shown as no text) and not fed back.
    s.ch->push(t);
    finish(s, FinishReason::stop);
    return false;
  }
  s.tokens.push_back(t.id);
  s.ch->push(t);
  if (s.n_generated >= s.req.max_tokens || static_cast<int64_t>(s.tokens.size()) >= opt_.max_model_len) {
    finish(s, FinishReason::length);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- speculative decoding
// Runs after the decode steps are planned (each with chunk 1): a sequence that speculates this
// step drafts from its committed state and its unfed last token (the anchor), and its decode
// item becomes a verify item [anchor, d1 .. dk]. The drafts take step budget and pool room that
// are free now; they never preempt anyone.
void Scheduler::plan_speculation(int64_t& budget) {
  for (auto& s : running_) s->verifying = false;
  if (!spec_ || opt_.spec.method == spec::SpecMethod::none) return;
  std::vector<Sequence*> decoding;
  for (auto& s : running_) {
    const bool decode = s->chunk == 1 && s->n_generated > 0 && s->state &&
                        static_cast<int64_t>(s->tokens.size()) - s->n_fed == 1 && s->n_fed >= s->state->prompt_len;
    if (decode) decoding.push_back(s.get());
  }
  const bool wide =
      opt_.spec.disable_batch_size > 0 && static_cast<int64_t>(decoding.size()) > opt_.spec.disable_batch_size;
  int64_t fallbacks = 0;
  std::vector<Sequence*> drafting;
  std::vector<int64_t> caps;
  for (Sequence* s : decoding) {
    if (!s->spec) continue;
    if (!s->spec->wants_draft()) {
      s->spec->skip_step();
      continue;
    }
    // A seeded sampled request keeps speculating in a wide batch: its tokens then depend only on
    // its own seed and request, not on what else runs.
    if (wide && !(s->req.sampling.has_seed && !s->sampler->greedy())) {
      s->spec->skip_step();
      ++fallbacks;
      continue;
    }
    // Each verify step commits at most drafts + 1 tokens: stay within max_tokens and the context.
    const int64_t cap = std::min({s->spec->max_drafts(), s->req.max_tokens - s->n_generated - 1,
                                  opt_.max_model_len - static_cast<int64_t>(s->tokens.size())});
    if (cap < 1) {
      s->spec->skip_step();
      continue;
    }
    drafting.push_back(s);
    caps.push_back(cap);
  }
  if (fallbacks > 0) {
    std::lock_guard lk(mu_);
    stats_.spec.fallback_steps += fallbacks;
  }
  if (drafting.empty()) return;
  std::vector<spec::Draft> drafts(drafting.size());
  std::vector<spec::DraftItem> items(drafting.size());
  for (size_t i = 0; i < drafting.size(); ++i)
    items[i] = spec::DraftItem{drafting[i]->state.get(), drafting[i]->tokens.back(), &drafts[i]};
  spec_->draft(items);
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence* s = drafting[i];
    int64_t k = s->spec->propose(drafts[i], caps[i], *s->sampler, s->bans, s->n_generated);
    k = std::min(k, budget);
    while (k > 0 && !grow(*s, s->n_fed + 1 + k)) --k;
    s->spec->truncate(k);
    if (k == 0) continue;
    s->verifying = true;
    s->chunk = 1 + k;
    budget -= k;
  }
}

void Scheduler::commit_verified(Sequence& s) {
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  const int64_t k = s.spec->k();
  DSV_ASSERT(s.logits.size() == static_cast<size_t>(k + 1) * vocab, "verify forward returned {} logits for {} rows",
             s.logits.size(), k + 1);
  spec::VerifyOutcome v = s.spec->verify(s.logits, static_cast<int64_t>(vocab), *s.sampler, s.bans, s.n_generated);
  s.verifying = false;
  // The state keeps the anchor and the accepted drafts; the last committed token stays unfed.
  spec_->rollback(*s.state, v.accepted + 1);
  s.n_fed += v.accepted + 1;
  {
    std::lock_guard lk(mu_);
    stats_.spec.record(k, v.accepted);
  }
  const int64_t step = ++s.steps;
  for (auto& t : v.tokens) {
    t.step = step;
    if (!deliver(s, std::move(t))) break;
  }
}

}  // namespace dsv41::sched
