// Host mailbox kernels (see host_mailbox.h).
#include "kernels/cuda/host_mailbox.h"

namespace moet::cuda {
namespace {

constexpr int kPublishThreads = 256;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void mailbox_publish_kernel(MailboxDevice m, const float* x, const int32_t* ids, const float* weights,
                                       int64_t rows, int64_t top_k, int64_t hidden) {
  for (int64_t i = threadIdx.x; i < rows * hidden; i += blockDim.x) m.x[i] = x[i];
  for (int64_t i = threadIdx.x; i < rows * top_k; i += blockDim.x) {
    m.ids[i] = ids[i];
    m.weights[i] = weights[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    *m.rows = int32_t(rows);
    __threadfence_system();
    *reinterpret_cast<volatile uint32_t*>(m.ready) = 1;
  }
}

__global__ void mailbox_wait_kernel(volatile uint32_t* done, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (*done != 1) {
    if (global_ns() - start > timeout_ns) {
      *done = 2;
      __threadfence_system();
      return;
    }
    __nanosleep(128);
  }
  *done = 0;
  __threadfence_system();  // the host's results, written before its flag, are read after this kernel
}

}  // namespace

void mailbox_publish_launch(const MailboxDevice& m, const float* x, const int32_t* ids, const float* weights,
                            int64_t rows, int64_t top_k, int64_t hidden, cudaStream_t stream) {
  mailbox_publish_kernel<<<1, kPublishThreads, 0, stream>>>(m, x, ids, weights, rows, top_k, hidden);
}

void mailbox_wait_launch(uint32_t* done, uint64_t timeout_ns, cudaStream_t stream) {
  mailbox_wait_kernel<<<1, 1, 0, stream>>>(done, timeout_ns);
}

}  // namespace moet::cuda
