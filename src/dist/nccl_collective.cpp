#include "dist/nccl_collective.h"

#if defined(DSV41_HAS_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace dsv41::dist {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw TpUnavailable(fmt::format("tensor-parallel NCCL {} failed: {}", what, ncclGetErrorString(r)));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA {} failed: {}", what, cudaGetErrorString(e));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(int rank, int world, const std::vector<uint8_t>& id, int device, AbortCheck abort)
      : rank_(rank), world_(world), abort_(std::move(abort)) {
    DSV_CHECK(id.size() == sizeof(ncclUniqueId), "NCCL unique id of {} bytes (expected {})", id.size(),
              sizeof(ncclUniqueId));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof(uid));
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Non-blocking init so a peer that never arrives cannot hang us: poll like every other call.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, world, uid, rank, &cfg), "init");
    wait_comm("init");
  }
  ~NcclCollective() override {
    if (comm_) ncclCommAbort(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "nccl"; }

  void all_gather(const void* send, std::span<const size_t> counts, void* out) override {
    DSV_CHECK(counts.size() == static_cast<size_t>(world_), "all_gather: {} counts for world size {}", counts.size(),
              world_);
    // Unequal parts: one broadcast per rank inside a group (NCCL's allgather needs equal counts).
    size_t off = 0;
    check_nccl(ncclGroupStart(), "group start");
    for (int r = 0; r < world_; ++r) {
      auto* dst = static_cast<uint8_t*>(out) + off;
      if (counts[r] > 0)
        check_nccl(ncclBroadcast(r == rank_ ? send : dst, dst, counts[r], ncclUint8, r, comm_, stream_), "broadcast");
      off += counts[r];
    }
    check_nccl(ncclGroupEnd(), "group end");
    wait_enqueued("all_gather");
    wait_stream("all_gather");
  }

  void all_reduce_sum(float* data, size_t n) override {
    if (n == 0) return;
    check_nccl(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "all_reduce");
    wait_enqueued("all_reduce");
    wait_stream("all_reduce");
  }

 private:
  void poll_abort(const char* what) {
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(comm_, &st);
    if (st != ncclSuccess && st != ncclInProgress) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      check_nccl(st, what);
    }
    if (abort_) {
      const std::string why = abort_();
      if (!why.empty()) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TpUnavailable(fmt::format("tensor-parallel {} aborted: {}", what, why));
      }
    }
  }
  // A non-blocking communicator may return from a call (ncclInProgress) before the operation is
  // on the stream; until the communicator reports success the stream can look idle.
  void wait_enqueued(const char* what) {
    DSV_CHECK(comm_ != nullptr, "tensor-parallel {}: the NCCL communicator was aborted", what);
    wait_comm(what);
  }
  void wait_comm(const char* what) {
    for (int i = 0;; ++i) {
      ncclResult_t st = ncclInProgress;
      ncclCommGetAsyncError(comm_, &st);
      if (st == ncclSuccess) return;
      poll_abort(what);
      backoff(i);
    }
  }
  void wait_stream(const char* what) {
    DSV_CHECK(comm_ != nullptr, "tensor-parallel {}: the NCCL communicator was aborted", what);
    for (int i = 0;; ++i) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, what);
      poll_abort(what);
      backoff(i);
    }
  }
  // A decode step's collectives take microseconds: spin first (a sleep costs ~100 µs or more
  // on some kernels), then sleep so a long wait (prefill, a slow peer) does not burn a core.
  static void backoff(int i) {
    if (i < 2000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  int rank_, world_;
  AbortCheck abort_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "unique id");
  std::vector<uint8_t> out(sizeof(id));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::unique_ptr<Collective> make_nccl_collective(int rank, int world, const std::vector<uint8_t>& unique_id,
                                                 int device, AbortCheck abort) {
  return std::make_unique<NcclCollective>(rank, world, unique_id, device, std::move(abort));
}

}  // namespace dsv41::dist
#endif  // DSV41_HAS_NCCL
