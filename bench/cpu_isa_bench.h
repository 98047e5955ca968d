// The common parts of the CPU kernel microbenchmarks that compare kernel levels against the host's
// memory bandwidth (experts_host_bench, formats_w2_matmul_bench): the level a benchmark argument
// names (the benchmark is skipped, visibly, where the CPU lacks it), and an "of_memcpy" counter:
// the benchmark's bytes per second (timed around its loop) over those of a memcpy of the same bytes per iteration,
// rotating over the same span, measured once per size in the same process (so both figures come
// from one run on a shared machine).
#pragma once

#include "core/cpu_isa.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moet {

// The levels a benchmark runs, as arguments (int(CpuIsa)).
inline const std::vector<int64_t> kBenchIsas{int64_t(CpuIsa::avx2), int64_t(CpuIsa::avx512)};

inline std::optional<CpuIsa> bench_cpu_isa(benchmark::State& state, int64_t arg) {
  const CpuIsa isa = CpuIsa(arg);
  if (cpu_supports(isa)) {
    state.SetLabel(cpu_isa_name(isa));
    return isa;
  }
  state.SkipWithError((std::string("this CPU lacks the ") + cpu_isa_name(isa) + " level").c_str());
  return std::nullopt;
}

// Bytes per second of memcpy copying `bytes` per call from successive places of a `span`-byte
// buffer: the median of 9 passes over the buffer (cached per size).
inline double memcpy_bytes_per_second(uint64_t bytes, uint64_t span) {
  static std::map<std::pair<uint64_t, uint64_t>, double> measured;
  const auto found = measured.find({bytes, span});
  if (found != measured.end()) return found->second;
  const size_t count = std::max<size_t>(2, span / bytes);
  std::vector<uint8_t> src(bytes * count, 1), dst(bytes);
  std::vector<double> rates;
  for (int pass = 0; pass < 9; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t e = 0; e < count; ++e) {
      std::memcpy(dst.data(), src.data() + e * bytes, bytes);
      benchmark::DoNotOptimize(dst.data());
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    rates.push_back(double(bytes * count) / took.count());
  }
  std::nth_element(rates.begin(), rates.begin() + 4, rates.end());
  return measured[{bytes, span}] = rates[4];
}

using BenchClock = std::chrono::steady_clock;

// After a benchmark's loop that began at `start` and processed `bytes` per iteration.
inline void report_of_memcpy(benchmark::State& state, BenchClock::time_point start, uint64_t bytes, uint64_t span) {
  const std::chrono::duration<double> took = BenchClock::now() - start;
  const double rate = double(state.iterations()) * double(bytes) / took.count();
  state.counters["of_memcpy"] = rate / memcpy_bytes_per_second(bytes, span);
}

}  // namespace moet
