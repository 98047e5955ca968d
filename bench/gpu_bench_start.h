// The common start of the CUDA microbenchmarks (cuda_*_bench.cpp): a CUDA backend and the
// device-to-device copy bandwidth measured in the same run, the ceiling every bench prints its
// GB/s against. Without a visible GPU it says so and the bench exits 0 (CI builds and runs them).
// Also the time per call as a decode step with CUDA graphs pays it (graph_seconds_per_call).
#pragma once

#include "backend/bench_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

namespace moet {

struct CudaBenchStart {
  std::unique_ptr<Backend> backend;  // null: no GPU
  double copy_gbs = 0.0;
};

inline CudaBenchStart start_cuda_bench(const char* name, size_t copy_bytes = size_t(2) << 30) {
  if (cuda_devices().empty()) {
    std::printf("%s: no CUDA GPU visible; nothing to measure\n", name);
    return {};
  }
  CudaBenchStart start{cuda_backend_create({}), 0.0};
  start.copy_gbs = bench_ops(*start.backend).copy_bandwidth(copy_bytes);
  std::printf("%s\ndevice-to-device copy: %.1f GB/s (read + write)\n", start.backend->name().c_str(), start.copy_gbs);
  return start;
}

// Seconds per call of call() run eagerly `timed` times after `warmup` calls (one synchronisation
// at the end, reading back `sync_on`: includes host launch overhead when the GPU work is short).
template <typename F>
double eager_seconds_per_call(Backend& backend, const Tensor& sync_on, int warmup, int timed, F&& call) {
  std::vector<uint8_t> sink(sync_on.bytes());
  for (int i = 0; i < warmup; ++i) call();
  backend.to_host(sync_on, sink.data());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < timed; ++i) call();
  backend.to_host(sync_on, sink.data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / timed;
}

// Seconds per call of op(i), i = 0..calls-1 captured into one CUDA graph (run_graph, under
// `key`, which must be fresh) and the graph replayed `replays` times after a first replay: the
// kernels plus their launch gaps inside a graph, without host launch overhead. `out` is read back
// to wait for the GPU.
template <typename Op>
double graph_seconds_per_call(Backend& backend, int64_t key, const Tensor& out, int calls, int replays, Op&& op) {
  const GraphKey graph{{key}};
  const auto body = [&] {
    for (int i = 0; i < calls; ++i) op(i);
    return out;
  };
  std::vector<uint8_t> sink(out.bytes());
  backend.run_graph(graph, body);  // capture and first replay
  backend.to_host(out, sink.data());
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < replays; ++r) backend.run_graph(graph, body);
  backend.to_host(out, sink.data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / (double(replays) * calls);
}

}  // namespace moet
