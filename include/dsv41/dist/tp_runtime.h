// The tensor-parallel runtime (docs/TENSOR_PARALLEL.md): rank 0 drives, workers follow.
//
// Control plane (TCP, rank 0 listens on --master-port; either side may start first): a worker
// connects (retrying), sends HELLO with protocol version, build version, rank, world size, config
// hash, checkpoint hash and Engram token-map hash; rank 0 refuses a mismatch with REJECT naming the
// field, else sends WELCOME with the run options (DSpark on/off, index-key mode). The worker loads
// its share of the weights, opens its data link, and reports READY. Then every step rank 0 sends
// a PLAN (sequence ops: new/free/clone/restore, forwards with their tokens, chunk boundaries and
// prompt lengths, DSpark drafts) before running the same ops itself, so every rank makes the same
// collective calls in the same order. Sampling happens on rank 0 only: the sampled ids reach the
// workers as the next step's tokens. Heartbeats flow both ways every 0.5 s; a link that is closed
// or silent for the heartbeat timeout (default 3 s) marks the rank dead: a blocked collective
// aborts with RankLost at once, and later steps fail fast until the rank is back. A restarted
// worker re-handshakes and is adopted at the next step (a new epoch); sequences from the old epoch
// are failed cleanly (their state on that rank is gone).
#pragma once
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <span>
#include <string>
#include <vector>

#include "dsv41/dist/collective.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"
#include "dsv41/model/model.h"

namespace dsv41::dist {

// Chosen by rank 0, sent to every worker in WELCOME (they change what a worker loads).
struct TpRunOptions {
  bool dspark = true;
  bool corrected_index_keys = false;
  // CUDA path: the NCCL unique id rank 0 made (src/dist/nccl_collective.h); empty on the CPU path.
  std::vector<uint8_t> nccl_id;
};

struct TpHeadOptions {
  int world_size = 2;
  std::string master_addr = "127.0.0.1";  // address to listen on (rank 0's control endpoint)
  int master_port = 29500;
  std::string model_dir;
  TpRunOptions run;
  double heartbeat_timeout_s = 3.0;
  // true (tools): workers exit when this model is destroyed; false (server): they go back to
  // waiting for a head.
  bool exit_workers_on_close = false;
};

struct TpWorkerOptions {
  int rank = 1;
  int world_size = 2;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string model_dir;
  std::string device = "cpu";
  std::string engram_token_map;
  std::string engram_dir;
  std::string engram_packed;     // --engram-packed
  double engram_cache_gib = 0.0;  // --engram-cache-gib
  double heartbeat_timeout_s = 3.0;
  // --device cuda: the GPU of this rank; -1 = rank modulo the visible devices (one GPU per rank on
  // a multi-GPU host; CUDA_VISIBLE_DEVICES with one device per process works too).
  int cuda_device = -1;
};

class TpHead;

// Rank 0's model: the local share (a CpuModel with a TCP collective, or a CudaModel with the NCCL
// collective) plus the control plane.
// Implements the Model interface for the server and CpuModel's extras for the tools.
class TpModel final : public Model {
 public:
  // Listens on master_addr:master_port at once (workers may already be retrying), then loads
  // rank 0's share. `mo` gives the local load options (tp and dspark are set from `o`).
  static std::unique_ptr<TpModel> start(const TpHeadOptions& o, model::CpuModelOptions mo);
  // The CUDA backend on every rank (`--device cuda`): rank 0 makes the NCCL unique id (sent in
  // WELCOME), joins the communicator once the workers do, and loads its share on mo.device. The
  // communicator lives as long as this model: a worker that restarts cannot rejoin it (restart
  // the head too). Clone/restore and DSpark drafting are not available on this path yet.
  static std::unique_ptr<TpModel> start_cuda(const TpHeadOptions& o, model::CudaModelOptions mo);
  ~TpModel() override;

  // Blocks until every worker is connected and ready; throws dsv41::Error after timeout_s.
  void wait_for_workers(double timeout_s);
  // Empty when every rank is ready, else "rank R: reason".
  std::string unavailable_reason() const;
  // This rank's collective counters (NCCL on the CUDA path, TCP on the CPU path), for /metrics.
  CollectiveStats collective_stats() const;

  const ModelConfig& config() const override;
  std::unique_ptr<SeqState> new_sequence() const override;
  std::unique_ptr<SeqState> new_sequence(std::pmr::memory_resource& memory, int64_t capacity_tokens) const override;
  void reserve_sequence(SeqState& state, int64_t capacity_tokens) const override;
  int64_t state_bytes(int64_t capacity_tokens) const override;
  // The local share's state memory (device memory on the CUDA path, for the server's state pool).
  std::pmr::memory_resource& state_memory() const override;
  // Throws RankLost (a rank is down) or dsv41::Error (bad input, or a sequence from before a
  // worker restarted) without running anything.
  void forward(std::span<ForwardItem> batch) override;

  void forward_sequence(SeqState& state, std::span<const int32_t> tokens, bool all_logits, std::vector<float>* logits,
                        model::BlockDump* dump = nullptr);
  bool has_dspark() const;
  model::DsparkDraft dspark_draft(const SeqState& state, int32_t anchor);
  std::unique_ptr<SeqState> clone_state(const SeqState& s);
  void restore_state(SeqState& dst, const SeqState& src);

  struct Impl;

 private:
  explicit TpModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The headless worker (`dsv41-serve --rank R --world-size N ...`): connects to rank 0, follows its
// plans, reconnects when rank 0 goes away, exits 0 when a tool head says so, 1 on a refusal.
int run_worker(const TpWorkerOptions& o);

}  // namespace dsv41::dist
