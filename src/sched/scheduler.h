// The engine loop: one thread owns the Model. HTTP threads submit GenerationRequests over a
// queue and read tokens from the per-request TokenChannel they get back (llama.cpp/nano-vllm
// shape). Continuous batching: every step decodes all running sequences and fills the rest of
// the --max-num-batched-tokens budget with prefill chunks, admitting waiting requests FCFS while
// --max-num-seqs and the state pool allow; when a running sequence cannot grow, the youngest
// running sequence is preempted (its state dropped, later recomputed from prompt + output).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsv41/model/model.h"
#include "dsv41/spec/options.h"
#include "dsv41/spec/spec_backend.h"
#include "dsv41/spec/stats.h"
#include "sched/sampling.h"
#include "sched/state_budget.h"

namespace dsv41::sched {

enum class FinishReason { none, stop, length, abort, error };
const char* finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 16;     // generated tokens at most
  int64_t min_tokens = 0;      // EOS and stop ids are banned before this many
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // Speculative decoding for this request: -1 = the server's setting; 0 = off; k > 0 = at most k
  // drafts per step (never more than the server's --spec-tokens). Output is the same either way
  // at temperature 0; sampled output keeps the target's distribution.
  int64_t spec_tokens = -1;
};

// Events of one sequence, produced by the scheduler thread, consumed by one HTTP thread.
class TokenChannel {
 public:
  // Waits up to `timeout` for news; moves new tokens into `out`. Returns true when finished (all
  // tokens delivered).
  bool wait(std::vector<SampledToken>& out, std::chrono::milliseconds timeout);
  // Asks the scheduler to stop this sequence; it is freed within one step.
  void cancel();
  bool cancelled() const { return cancel_.load(); }
  FinishReason finish_reason() const;
  std::string error() const;
  // True when the error is transient (the engine stalled): the client should retry (HTTP 503).
  bool retryable() const;
  int64_t prompt_tokens() const { return prompt_tokens_; }

  // ---- scheduler side ----
  void push(const SampledToken& t);
  // The first finish wins; tokens pushed after it are dropped.
  void finish(FinishReason r, std::string error = {}, bool retryable = false);
  explicit TokenChannel(int64_t prompt_tokens) : prompt_tokens_(prompt_tokens) {}

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<SampledToken> pending_;
  FinishReason reason_ = FinishReason::none;
  std::string error_;
  bool retryable_ = false;
  std::atomic<bool> cancel_{false};
  int64_t prompt_tokens_;
  std::function<void()> on_cancel_;
  friend class Scheduler;
};

struct SchedulerOptions {
  int64_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 512;
  int64_t max_model_len = 0;      // 0: the config's max_position_embeddings
  double kv_cache_gib = 4.0;
  int64_t block_tokens = 16;
  int64_t max_waiting = 256;      // submissions beyond this are refused (HTTP 429)
  spec::SpecOptions spec;         // speculative decoding (needs a SpecBackend)
  // Memory gate (the runtime memory watchdog, checked once per step): while it returns false no
  // waiting sequence is admitted and no prefill chunk runs (decode continues), so long prefills
  // check the margin per chunk.
  std::function<bool()> memory_ok;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;
  double kv_usage = 0.0;
  // The state pool in real bytes (what the engine allocated for live sequences).
  int64_t pool_used_bytes = 0, pool_capacity_bytes = 0, pool_peak_bytes = 0;
  int64_t live_states = 0;  // SeqState objects alive (0 when idle)
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0, preemptions_total = 0;
  int64_t iterations_total = 0, iteration_tokens_total = 0;
  int64_t finished_stop = 0, finished_length = 0, finished_abort = 0, finished_error = 0;
  bool healthy = true;
  spec::SpecStats spec;
};

class Overloaded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Scheduler {
 public:
  // `spec` (optional, outlives the scheduler) drafts, verifies and rolls back for speculative
  // decoding when o.spec.method is not none; it must run on the same engine as `model`.
  Scheduler(Model& model, const SchedulerOptions& o, spec::SpecBackend* spec = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void start();
  void stop();  // finishes every open channel with `abort`

  // Thread-safe. Throws Overloaded when the queue is full or the engine has failed; throws
  // dsv41::Error for a request that can never run (prompt + max_tokens over the capacity).
  std::shared_ptr<TokenChannel> submit(GenerationRequest r);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return opt_; }
  int64_t max_model_len() const { return opt_.max_model_len; }
  const StateBytes& state_bytes_info() const { return bytes_; }
  const StatePool& pool() const { return pool_; }
  // Context tokens one sequence alone can hold in the pool (what start-up reports).
  int64_t capacity_tokens() const { return capacity_tokens_; }
  const ModelConfig& config() const { return model_.config(); }

  // ---- runtime guards (src/sched/scheduler_guards.cpp); thread-safe ----
  // Engine steps finished and sequences running or waiting: the stall detector's progress and
  // work-pending inputs (atomics, never block).
  uint64_t steps_done() const { return steps_done_.load(); }
  bool work_pending() const { return pending_.load() > 0; }
  // Asks the loop to preempt the youngest running sequence at its next step (memory watchdog).
  // False while an earlier request is still pending or nothing runs.
  bool request_preemption();
  // The engine is stuck (stall detector): every open request ends now with a retryable error
  // naming `reason` (HTTP 503) and new ones are refused until set_stalled(false).
  void set_stalled(bool stalled, const std::string& reason = {});
  // Queues, pool and counters as text (stall dumps); takes the stats lock only.
  std::string describe() const;

 private:
  struct Sequence;
  void loop();
  bool step();  // false when there was nothing to do
  void drop(Sequence& s);
  void finish(Sequence& s, FinishReason r, const std::string& err = {});
  bool grow(Sequence& s, int64_t tokens);
  bool preempt_youngest_other(const Sequence* keep);
  // Delivers one generated token (EOS/stop ids/length end the sequence; counted in the stats before
  // the client sees it); false when it ended it.
  bool deliver(Sequence& s, SampledToken t);
  // Speculative decoding (docs/SPECULATIVE.md): turns planned decode steps into verify steps.
  void plan_speculation(int64_t& budget);
  // After the forward: accepts drafts, rolls the state back, delivers the committed tokens.
  void commit_verified(Sequence& s);

  Model& model_;
  spec::SpecBackend* spec_ = nullptr;
  SchedulerOptions opt_;
  StateBytes bytes_;
  StatePool pool_;  // declared before every container of states: states die before their pool
  int64_t capacity_tokens_ = 0;

  mutable std::mutex mu_;  // guards inbox_, stats_, pool_ snapshot fields
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  bool stopping_ = false;
  std::atomic<bool> wake_{false};
  SchedulerStats stats_;

  // Owned by the loop thread.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  uint64_t next_arrival_ = 0;
  std::thread thread_;

  // Runtime guards.
  std::atomic<uint64_t> steps_done_{0};
  std::atomic<int64_t> pending_{0};
  std::atomic<bool> preempt_requested_{false};
  std::vector<std::weak_ptr<TokenChannel>> open_;  // every submitted channel not yet seen closed (mu_)
  bool stalled_ = false;                           // (mu_)
  std::string stalled_reason_;                     // (mu_)
};

}  // namespace dsv41::sched
