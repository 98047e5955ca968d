// A ring of shared-memory stages that one producer warp fills from global memory while consumer
// warps of the same block read them, synchronised by mbarriers: full[s] completes once stage s's
// bytes have landed, empty[s] once every consumer warp has released it (one arrival each). On
// sm_90 and later the producer's lane 0 fills a stage with bulk asynchronous copies (the TMA
// engine, one instruction per contiguous piece, completion counted in bytes on full[s]); before
// sm_90 the producer's 32 lanes issue 16-byte cp.async copies and each lane arrives on full[s]
// when its own copies have landed. Every producer call is made by all 32 lanes of its warp.
// Pieces must be 16-byte aligned at both ends, sizes multiples of 16 bytes. Building with
// -DMOET_STAGE_PIPE_CP_ASYNC takes the pre-sm_90 path everywhere (to test it on an sm_90 GPU).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(MOET_STAGE_PIPE_CP_ASYNC)
#define MOET_STAGE_PIPE_BULK 1
#else
#define MOET_STAGE_PIPE_BULK 0
#endif

namespace moet::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Arrivals that complete full[s] once per fill.
__device__ __forceinline__ uint32_t stage_fill_arrivals() {
#if MOET_STAGE_PIPE_BULK
  return 1;  // the producer's expect-bytes arrival
#else
  return 32;  // one per producer lane, when its copies land
#endif
}

// One thread initialises the barriers; a __syncthreads() must follow before any use.
__device__ __forceinline__ void stage_barriers_init(uint64_t* full, uint64_t* empty, int stages, uint32_t consumers) {
  for (int s = 0; s < stages; ++s) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(shared_address(full + s)), "r"(stage_fill_arrivals()));
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(shared_address(empty + s)), "r"(consumers));
  }
#if MOET_STAGE_PIPE_BULK
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the copy engine
#endif
}

// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void stage_wait(uint64_t* bar, uint32_t parity) {
#if MOET_STAGE_PIPE_BULK
  asm volatile(
      "{\n .reg .pred done;\n wait_%=:\n mbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n}" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#else
  asm volatile(
      "{\n .reg .pred done;\n wait_%=:\n mbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n}" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// A consumer warp's release of a stage: one arrival, after all its lanes' reads.
__device__ __forceinline__ void stage_release(uint64_t* empty, int lane) {
  __syncwarp();
  if (lane == 0) asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}" ::"r"(shared_address(empty)) : "memory");
}

// Producer: announces a fill of `bytes` in total into the stage of `full`.
__device__ __forceinline__ void stage_fill_begin(uint64_t* full, uint32_t bytes, int lane) {
#if MOET_STAGE_PIPE_BULK
  if (lane == 0)
    asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared.b64 state, [%0], %1;\n}" ::"r"(
                     shared_address(full)),
                 "r"(bytes)
                 : "memory");
#else
  (void)full, (void)bytes, (void)lane;
#endif
}

// Producer: copies one contiguous piece of the fill.
__device__ __forceinline__ void stage_fill_piece(void* dst, const void* src, uint32_t bytes, uint64_t* full, int lane) {
#if MOET_STAGE_PIPE_BULK
  if (lane == 0)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     shared_address(dst)),
                 "l"(src), "r"(bytes), "r"(shared_address(full))
                 : "memory");
#else
  (void)full;
  for (uint32_t at = uint32_t(lane) * 16; at < bytes; at += 32 * 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(static_cast<char*>(dst) + at)),
                 "l"(static_cast<const char*>(src) + at)
                 : "memory");
#endif
}

// Producer: ends the fill (before sm_90: each lane's arrival once its copies have landed).
__device__ __forceinline__ void stage_fill_end(uint64_t* full, int lane) {
#if MOET_STAGE_PIPE_BULK
  (void)full, (void)lane;
#else
  (void)lane;
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(shared_address(full)) : "memory");
#endif
}

}  // namespace moet::cuda
