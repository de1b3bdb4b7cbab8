// The NCCL collective backend (CUDA path), compiled when CUDA and NCCL are found (DSV41_HAS_NCCL).
// Rank 0 makes the unique id (nccl_unique_id) and sends it to the workers over the control plane
// (WELCOME's nccl_id); every rank then builds its communicator from it. Pointers are device memory;
// each call runs on the communicator's stream and returns when the stream finished, polling
// ncclCommGetAsyncError and the abort check (heartbeat monitor) meanwhile: on a dead rank or an
// NCCL error the communicator is aborted and the call throws (RankLost / TpUnavailable).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/net.h"
#include "dsv41/dist/collective.h"

namespace dsv41::dist {

#if defined(DSV41_HAS_NCCL)
std::vector<uint8_t> nccl_unique_id();
// `device`: the CUDA device this rank uses.
std::unique_ptr<Collective> make_nccl_collective(int rank, int world, const std::vector<uint8_t>& unique_id,
                                                 int device, AbortCheck abort);
#endif

}  // namespace dsv41::dist
