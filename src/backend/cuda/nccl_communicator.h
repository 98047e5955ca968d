// NCCL collectives for a model split over GPUs (docs/parallel.md), in plain C++: no CUDA or NCCL
// header here. NCCL is loaded at run time (dlopen of libnccl.so.2, or the file MOET_NCCL_LIBRARY
// names), so moet starts and runs on one GPU where NCCL is not installed; only a split model needs
// it. Built when the CUDA toolkit has nccl.h (MOET_HAVE_NCCL).
// Ranks are threads of a process, one GPU each (a process per node; across nodes NCCL's own
// bootstrap connects them from one unique id that rank 0 makes and backend/rendezvous.h hands
// out). Each rank's collectives are enqueued on its CUDA backend's stream, so they order with the
// ops around them and a CUDA graph captures them (the backend captures in relaxed mode, which
// lets other ranks' threads keep calling CUDA meanwhile).
#pragma once

#include "backend/communicator.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace moet {

// NCCL's unique id (ncclUniqueId, NCCL_UNIQUE_ID_BYTES): made once by global rank 0, given to all.
using NcclId = std::array<uint8_t, 128>;

// "2.28.9" for the library loaded; throws a one-line error when NCCL cannot be loaded.
std::string nccl_version();
NcclId nccl_unique_id();

// The local ranks of this process: global ranks [first_rank, first_rank + local_size) of `size`,
// local rank l on the CUDA backend connect() is given (its device bound on l's thread). abort()
// aborts every communicator (ncclCommAbort: a rank blocked in a collective returns); reset() is
// false (an aborted NCCL communicator cannot be used again).
std::unique_ptr<CommGroup> nccl_comm_group_create(const NcclId& id, int size, int first_rank, int local_size);

}  // namespace moet
