// The gate of the CUDA backend's per-op profile: a one-thread kernel that holds its stream until
// the host has enqueued the op that follows it, so the CUDA events around the op time the GPU's
// work and not the host's launch latency. The host enqueues [gate(v), start event, the op's
// kernels, stop event] and then writes v into `flag` (mapped pinned memory); the gate spins on
// the flag (wrap-safe compare) and gives up after `timeout_ns`, so a host blocked for another
// reason (a full launch queue, an implicit synchronisation) cannot deadlock the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

void profile_gate_launch(const volatile uint32_t* flag, uint32_t value, uint64_t timeout_ns, cudaStream_t stream);

}  // namespace moet::cuda
