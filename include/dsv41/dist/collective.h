// The data plane between tensor-parallel ranks: all-gather and all-reduce behind one interface.
// Backends: TCP (CPU path, two processes on one machine or two hosts; src/dist/tcp_collective.cpp)
// and NCCL (CUDA path, compiled when NCCL is present; src/dist/nccl_collective.cpp).
//
// Every call is collective: all ranks call the same sequence of operations with the same sizes
// (the control plane's step plans guarantee it). A lost peer surfaces as RankLost, never a hang.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dsv41/common/error.h"

namespace dsv41::dist {

// The tensor-parallel group cannot run a request right now (a rank is down, or the request's
// sequence predates a worker's restart). Messages start with "tensor-parallel"; the server answers
// them with 503 and the message (the client may retry).
class TpUnavailable : public Error {
 public:
  using Error::Error;
};

// A peer rank disappeared (process died, link lost, heartbeat timeout, restarted) during or before
// a collective. The message names the rank and the reason.
class RankLost : public TpUnavailable {
 public:
  RankLost(int rank, const std::string& reason)
      : TpUnavailable(fmt::format("tensor-parallel rank {} is unavailable: {}", rank, reason)), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// What a collective moved since it was made, for /metrics. `seconds` is the time inside the
// calls: host wall time for the TCP backend (its calls block); for NCCL, the device time between
// events around each call on its stream (a wait for a late peer included), collected when the
// caller's stream has passed them, and only with DSV41_TP_TIMING=1 (timed_calls counts those).
struct CollectiveStats {
  uint64_t all_reduce_calls = 0, all_reduce_bytes = 0, all_gather_calls = 0, all_gather_bytes = 0;
  uint64_t timed_calls = 0;
  double seconds = 0.0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* backend() const = 0;
  // Rank r contributes counts[r] bytes from `send`; `out` receives every rank's bytes back to back
  // in rank order (sum(counts) bytes; `send` may point into `out` at this rank's offset).
  // Memory is host memory for the TCP backend and device memory for NCCL.
  virtual void all_gather(const void* send, std::span<const size_t> counts, void* out) = 0;
  // In place: data[i] = sum over ranks of data[i] (fp32). The TCP backend adds in rank order
  // 0, 1, ..., so results are reproducible run to run; NCCL's order is its own.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // Safe from any thread (the metrics endpoint reads it while steps run).
  virtual CollectiveStats stats() const = 0;
};

// Prometheus text of a tensor-parallel run's collective counters (rank 0's view).
std::string format_collective_metrics(const CollectiveStats& s);

// Even split of `total` items over `world` ranks in units of `align` (the last unit may be short):
// [begin, end) of `rank`. Ranks beyond the number of units get an empty range.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
Range split_range(int64_t total, int rank, int world, int64_t align = 1);

}  // namespace dsv41::dist
