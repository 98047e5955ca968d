// The device side of a host mailbox (backend/expert_types.h, HostMailbox): the MoE op of a layer
// with experts computed on the host publishes the layer's rows and routing into page-locked host
// memory and raises the mailbox's ready flag, and before its combine waits for the host's done
// flag. Both are kernels (one block, one thread), so a captured CUDA graph replays them like any
// other node (the same pattern as the profile gate, profile_gate.h). The wait spins with
// __nanosleep on the mapped flag; it clears the flag when it sees 1, and after `timeout_ns` it
// gives up and leaves 2 there, which the host reports as an error after the pass (a lost host
// thread must not hang the GPU).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

// The mailbox as the device addresses it (cudaHostGetDevicePointer of the host's pointers).
struct MailboxDevice {
  float* x;          // [rows, hidden]
  int32_t* ids;      // [rows * top_k]
  float* weights;    // [rows * top_k]
  int32_t* rows;
  uint32_t* ready;
};

// Copies x, ids and weights of `rows` rows into the mailbox, writes rows, then (every write
// visible to the host first) *ready = 1.
void mailbox_publish_launch(const MailboxDevice& m, const float* x, const int32_t* ids, const float* weights,
                            int64_t rows, int64_t top_k, int64_t hidden, cudaStream_t stream);
// Waits until *done == 1, then *done = 0 (or, after timeout_ns, *done = 2).
void mailbox_wait_launch(uint32_t* done, uint64_t timeout_ns, cudaStream_t stream);

}  // namespace moet::cuda
