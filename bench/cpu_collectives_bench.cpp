// Microbenchmarks of the in-process CPU communicator (backend/cpu/cpu_communicator.h, Google
// Benchmark): the time of one collective among 2 and 4 ranks (threads, one CPU backend each) at a
// decode step's sizes: rows of DeepSeek-V3's hidden size 7168 (the all-reduce after each block),
// 1 and 8 rows; all_gather and all_to_all of the same bytes. Each iteration runs 16 collectives on
// every rank: the time per collective is Time / 16 (items_per_second = collectives/s). On a machine
// with fewer cores than ranks this measures the threads' hand-over more than the copies. Run:
// build/bench/cpu_collectives_bench --benchmark_counters_tabular=true
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_communicator.h"
#include "core/rank_threads.h"

#include <benchmark/benchmark.h>

#include <vector>

namespace moet {
namespace {

constexpr int64_t kHidden = 7168;
constexpr int kPerIteration = 16;

enum class Op { all_reduce, all_gather, all_to_all };

void collective(benchmark::State& state, Op op) {
  const int ranks = int(state.range(0));
  const int64_t rows = state.range(1), n = rows * kHidden;
  CpuCommGroup group(ranks);
  RankThreads threads(ranks);
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<Tensor> in, out;
  for (int r = 0; r < ranks; ++r) {
    backends.push_back(cpu_backend_create({1, cpu_isa_best()}));
    comms.push_back(group.connect(r, *backends.back()));
    in.push_back(backends.back()->alloc({n}));
    out.push_back(backends.back()->alloc({op == Op::all_gather ? n * ranks : n}));
    std::fill_n(in.back().as<float>(), n, float(r) * 0.5f);
  }
  for (auto _ : state) {
    threads.run([&](int r) {
      Communicator& comm = *comms[size_t(r)];
      for (int i = 0; i < kPerIteration; ++i) {
        if (op == Op::all_reduce) comm.all_reduce(in[size_t(r)]);
        if (op == Op::all_gather) comm.all_gather(in[size_t(r)], out[size_t(r)]);
        if (op == Op::all_to_all) comm.all_to_all(in[size_t(r)], out[size_t(r)]);
      }
    });
  }
  state.SetItemsProcessed(state.iterations() * kPerIteration);
  state.SetBytesProcessed(state.iterations() * kPerIteration * n * int64_t(sizeof(float)));
}

void args(benchmark::internal::Benchmark* b) {
  for (int ranks : {2, 4})
    for (int rows : {1, 8}) b->Args({ranks, rows});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(collective, all_reduce, Op::all_reduce)->Apply(args);
BENCHMARK_CAPTURE(collective, all_gather, Op::all_gather)->Apply(args);
BENCHMARK_CAPTURE(collective, all_to_all, Op::all_to_all)->Apply(args);

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
