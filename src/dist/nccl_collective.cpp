#include "dist/nccl_collective.h"

#include <chrono>
#include <thread>

namespace dsv41::dist {

void poll_backoff(int i) {
  if (i < 2000) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace dsv41::dist

#if defined(DSV41_HAS_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dsv41::dist {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw TpUnavailable(fmt::format("tensor-parallel NCCL {} failed: {}", what, ncclGetErrorString(r)));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA {} failed: {}", what, cudaGetErrorString(e));
}

class NcclCollective final : public DeviceCollective {
 public:
  NcclCollective(int rank, int world, const std::vector<uint8_t>& id, int device, AbortCheck abort)
      : rank_(rank), world_(world), abort_(std::move(abort)) {
    const char* timing = std::getenv("DSV41_TP_TIMING");
    timing_ = timing && std::strcmp(timing, "1") == 0;
    DSV_CHECK(id.size() == sizeof(ncclUniqueId), "NCCL unique id of {} bytes (expected {})", id.size(),
              sizeof(ncclUniqueId));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof(uid));
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Every connection is made while the communicator forms, where a lost peer can still abort
    // it (below), not lazily inside the first collective of each kind (NCCL's runtime connect),
    // which the blocking data communicator could not leave. A value the user set is kept.
    static std::once_flag connect_at_init;
    std::call_once(connect_at_init, [] { setenv("NCCL_RUNTIME_CONNECT", "0", 0); });
    // Non-blocking init so a peer that never arrives cannot hang us: poll like every other call.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&init_, world, uid, rank, &cfg), "init");
    wait_init("init", nullptr);
    // Each call on a non-blocking communicator is launched from a thread NCCL starts for it while
    // the caller polls: ~0.1 ms of host time per all-reduce on the H200 host, more than a decode
    // step's kernels between two all-reduces. The collectives therefore run on a blocking child
    // communicator (same ranks), split off inside a group so that the split itself runs in the
    // background like the init and stays abortable.
    ncclConfig_t data_cfg = NCCL_CONFIG_INITIALIZER;
    data_cfg.blocking = 1;
    check_nccl(ncclGroupStart(), "group start");
    const ncclResult_t split = ncclCommSplit(init_, 0, rank, &comm_, &data_cfg);
    const ncclResult_t end = ncclGroupEnd();
    check_nccl(split, "split");
    check_nccl(end, "split");
    wait_init("split", &comm_);
  }
  ~NcclCollective() override {
    if (comm_) ncclCommAbort(comm_);
    if (init_) ncclCommAbort(init_);
    for (auto& [a, b] : events_) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "nccl"; }

  void all_gather(const void* send, std::span<const size_t> counts, void* out) override {
    DSV_CHECK(counts.size() == static_cast<size_t>(world_), "all_gather: {} counts for world size {}", counts.size(),
              world_);
    alive("all_gather");
    // Unequal parts: one broadcast per rank inside a group (NCCL's allgather needs equal counts).
    size_t off = 0;
    const size_t first = begin_timing(stream_);
    check_nccl(ncclGroupStart(), "group start");
    for (int r = 0; r < world_; ++r) {
      auto* dst = static_cast<uint8_t*>(out) + off;
      if (counts[r] > 0)
        check_nccl(ncclBroadcast(r == rank_ ? send : dst, dst, counts[r], ncclUint8, r, comm_, stream_), "broadcast");
      off += counts[r];
    }
    check_nccl(ncclGroupEnd(), "group end");
    end_timing(stream_, first, false, off);
    wait_stream("all_gather");
    settle();
  }

  void all_reduce_sum(float* data, size_t n) override {
    all_reduce_sum_on(data, n, stream_);
    wait_stream("all_reduce");
    settle();
  }

  void all_reduce_sum_on(float* data, size_t n, CUstream_st* stream) override {
    if (n == 0) return;
    alive("all_reduce");
    const size_t first = begin_timing(stream);
    // Blocking communicator: the call returns with the operation on the stream.
    check_nccl(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream), "all_reduce");
    end_timing(stream, first, true, n * sizeof(float));
  }

  void check_alive(const char* what) override {
    alive(what);
    poll_abort(what);
  }

  void settle() override {
    double ms_total = 0.0;
    for (size_t i = 0; i < timed_; ++i) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, events_[i].first, events_[i].second) == cudaSuccess) ms_total += ms;
    }
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.timed_calls += timed_;
    stats_.seconds += ms_total * 1e-3;
    timed_ = 0;
  }

  CollectiveStats stats() const override {
    std::lock_guard<std::mutex> lk(stats_mu_);
    return stats_;
  }

 private:
  void alive(const char* what) const {
    if (!comm_) throw TpUnavailable(fmt::format("tensor-parallel {}: the NCCL communicator was aborted", what));
  }
  // DSV41_TP_TIMING=1: an event pair around each call on its stream (a pool reused after settle()).
  size_t begin_timing(cudaStream_t s) {
    if (!timing_) return 0;
    if (timed_ == events_.size()) {
      cudaEvent_t a = nullptr, b = nullptr;
      check_cuda(cudaEventCreate(&a), "timing event");
      check_cuda(cudaEventCreate(&b), "timing event");
      events_.emplace_back(a, b);
    }
    check_cuda(cudaEventRecord(events_[timed_].first, s), "timing event");
    return timed_;
  }
  void end_timing(cudaStream_t s, size_t slot, bool reduce, size_t bytes) {
    if (timing_) {
      check_cuda(cudaEventRecord(events_[slot].second, s), "timing event");
      timed_ = slot + 1;
    }
    std::lock_guard<std::mutex> lk(stats_mu_);
    (reduce ? stats_.all_reduce_calls : stats_.all_gather_calls) += 1;
    (reduce ? stats_.all_reduce_bytes : stats_.all_gather_bytes) += bytes;
  }
  // Aborts both communicators (ending any of their kernels) and forgets them.
  void abort_all() {
    if (comm_) ncclCommAbort(comm_);
    if (init_) ncclCommAbort(init_);
    comm_ = init_ = nullptr;
  }
  void poll_abort(const char* what) {
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(comm_, &st);
    if (st != ncclSuccess && st != ncclInProgress) {
      abort_all();
      check_nccl(st, what);
    }
    check_abort(what);
  }
  // The abort check (heartbeat monitor): a non-empty reason aborts and throws.
  void check_abort(const char* what) {
    if (!abort_) return;
    const std::string why = abort_();
    if (why.empty()) return;
    abort_all();
    throw TpUnavailable(fmt::format("tensor-parallel {} aborted: {}", what, why));
  }
  // Waits for a background init or split on init_: `child` (the split's output, written by
  // NCCL's thread when it is done) null for the init itself. Errors and the abort check end it.
  void wait_init(const char* what, ncclComm_t* child) {
    for (int i = 0;; ++i) {
      ncclResult_t st = ncclInProgress;
      ncclCommGetAsyncError(init_, &st);
      const ncclComm_t made = child ? std::atomic_ref<ncclComm_t>(*child).load() : nullptr;
      if (st == ncclSuccess && (!child || made)) {
        if (!child) return;
        ncclResult_t cst = ncclInProgress;
        ncclCommGetAsyncError(made, &cst);
        if (cst == ncclSuccess) return;
        if (cst != ncclInProgress) {
          abort_all();
          check_nccl(cst, what);
        }
      } else if (st != ncclInProgress && st != ncclSuccess) {
        abort_all();
        check_nccl(st, what);
      }
      check_abort(what);
      poll_backoff(i);
    }
  }
  void wait_stream(const char* what) {
    alive(what);
    for (int i = 0;; ++i) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, what);
      poll_abort(what);
      poll_backoff(i);
    }
  }

  int rank_, world_;
  AbortCheck abort_;
  ncclComm_t init_ = nullptr;  // non-blocking: formed in the background, abortable
  ncclComm_t comm_ = nullptr;  // its blocking child: the collectives
  cudaStream_t stream_ = nullptr;
  bool timing_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  size_t timed_ = 0;  // event pairs recorded since the last settle()
  mutable std::mutex stats_mu_;
  CollectiveStats stats_;
};

}  // namespace

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "unique id");
  std::vector<uint8_t> out(sizeof(id));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::unique_ptr<DeviceCollective> make_nccl_collective(int rank, int world, const std::vector<uint8_t>& unique_id,
                                                       int device, AbortCheck abort) {
  return std::make_unique<NcclCollective>(rank, world, unique_id, device, std::move(abort));
}

}  // namespace dsv41::dist
#endif  // DSV41_HAS_NCCL
