// The NCCL collective backend (CUDA path), compiled when CUDA and NCCL are found (DSV41_HAS_NCCL).
// Rank 0 makes the unique id (nccl_unique_id) and sends it to the workers over the control plane
// (WELCOME's nccl_id); every rank then builds its communicator from it. Pointers are device memory.
// The communicator forms non-blocking (a peer that never comes cannot hang the start, every
// connection is made then) and the collectives run on a blocking child split off from it: a call
// on a non-blocking communicator costs a thread start on the host, ~0.1 ms.
//
// Two ways to call it. The Collective calls run on the communicator's own stream and return when
// it finished. The CUDA engine instead enqueues all-reduces on its compute stream
// (DeviceCollective::all_reduce_sum_on: no host round trip per call, the step's kernels follow
// at once) and polls check_alive() in every wait of its step. Either way a dead rank (heartbeat
// monitor) or an NCCL error aborts the communicator, which ends its kernels, and the caller gets
// TpUnavailable / RankLost.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/net.h"
#include "dsv41/dist/collective.h"

struct CUstream_st;  // cudaStream_t, without the CUDA headers

namespace dsv41::dist {

class DeviceCollective : public Collective {
 public:
  // data[i] = sum over ranks (fp32, device memory), enqueued on `stream` after its earlier work;
  // returns once NCCL has the operation on the stream, not when it ran.
  virtual void all_reduce_sum_on(float* data, size_t n, CUstream_st* stream) = 0;
  // Throws TpUnavailable (after aborting the communicator) when a rank is lost or NCCL failed.
  // Cheap: meant for the poll loop of a wait on a stream that holds this collective's work.
  virtual void check_alive(const char* what) = 0;
  // Call when the stream has passed every all_reduce_sum_on so far: collects their timing.
  virtual void settle() = 0;
};

// A wait loop's pause: spin (yield) first, since a decode step's waits last microseconds and a
// sleep costs ~100 us on some kernels, then 50 us sleeps so a long wait does not burn a core.
void poll_backoff(int iteration);

#if defined(DSV41_HAS_NCCL)
std::vector<uint8_t> nccl_unique_id();
// `device`: the CUDA device this rank uses.
std::unique_ptr<DeviceCollective> make_nccl_collective(int rank, int world, const std::vector<uint8_t>& unique_id,
                                                       int device, AbortCheck abort);
#endif

}  // namespace dsv41::dist
