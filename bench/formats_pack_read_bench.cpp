// Pack read throughput as a ratio to a plain sequential read of the same file in the same run.
// A ~250 MB W2 pack (2 layers x 96 experts of Qwen3-30B-A3B size, H 2048, I 768) is written once;
// each iteration drops the file from the page cache (POSIX_FADV_DONTNEED), reads it sequentially
// with read() in 1 MiB chunks, drops it again, then reads every slot in a shuffled order, in
// batches of 32, with the chosen back end (pread pool of 8 threads, O_DIRECT, io_uring).
// Counters: seq_GBps, pack_GBps and ratio = pack / sequential.
#include "core/error.h"
#include "io/pack_reader.h"

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>

namespace moet {
namespace {

struct BenchPack {
  std::filesystem::path dir;
  PackSpec spec;
  PackPaths paths;
};

const BenchPack& bench_pack() {
  static const BenchPack pack = [] {
    BenchPack p;
    p.dir = std::filesystem::temp_directory_path() / ("moet-pack-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p.dir);
    p.spec.identity = "bench";
    p.spec.n_layers = 2;
    p.spec.n_experts = 96;
    p.spec.hidden = 2048;
    p.spec.intermediate = 768;
    p.spec.layers = {0, 1};
    p.paths = pack_paths(p.dir, p.spec.format, 0, 1);
    std::vector<uint8_t> chunk(1 << 20);
    std::mt19937 rng(1);
    for (auto& b : chunk) b = uint8_t(rng());
    const int fd = ::open(p.paths.pack.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (uint64_t off = 0; off < p.spec.file_bytes(); off += chunk.size())
      if (::pwrite(fd, chunk.data(), std::min<uint64_t>(chunk.size(), p.spec.file_bytes() - off), off_t(off)) < 0) std::abort();
    ::fdatasync(fd);
    ::close(fd);
    std::ofstream(p.paths.sidecar) << pack_sidecar_json(p.spec).dump(2);
    return p;
  }();
  // Registered after `pack` is complete, so it runs before pack's destructor.
  static const bool cleanup = (std::atexit([] { std::filesystem::remove_all(bench_pack().dir); }), true);
  (void)cleanup;
  return pack;
}

void drop_cache(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double sequential_read(const std::filesystem::path& path, std::vector<uint8_t>& buffer) {
  drop_cache(path);
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, buffer.data(), buffer.size()) > 0) {
  }
  ::close(fd);
  return seconds_since(start);
}

void BM_PackRead(benchmark::State& state) {
  const BenchPack& p = bench_pack();
  const PackIo io = PackIo(state.range(0));
  std::unique_ptr<PackReader> reader;
  try {
    reader = PackReader::open(p.paths, p.spec, io, 8);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  constexpr size_t kBatch = 32;
  const uint64_t stride = reader->stride();
  uint8_t* slots = static_cast<uint8_t*>(std::aligned_alloc(kPackAlign, kBatch * stride));
  std::vector<uint8_t> seq_buffer(1 << 20);
  std::vector<PackRead> all;
  for (int64_t layer : p.spec.layers)
    for (int64_t e = 0; e < p.spec.n_experts; ++e) all.push_back({layer, e, nullptr});
  std::shuffle(all.begin(), all.end(), std::mt19937(7));
  double seq_time = 0, pack_time = 0;
  for (auto _ : state) {
    seq_time += sequential_read(p.paths.pack, seq_buffer);
    drop_cache(p.paths.pack);
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < all.size(); i += kBatch) {
      std::vector<PackRead> batch(all.begin() + i, all.begin() + std::min(all.size(), i + kBatch));
      for (size_t j = 0; j < batch.size(); ++j) batch[j].dst = slots + j * stride;
      reader->read(batch);
    }
    const double t = seconds_since(start);
    pack_time += t;
    state.SetIterationTime(t);
  }
  std::free(slots);
  const double bytes = double(p.spec.file_bytes()) * double(state.iterations());
  state.counters["seq_GBps"] = bytes / seq_time / 1e9;
  state.counters["pack_GBps"] = bytes / pack_time / 1e9;
  state.counters["ratio"] = seq_time / pack_time;
  state.SetLabel(pack_io_name(io));
}

BENCHMARK(BM_PackRead)->Arg(int(PackIo::pread))->Arg(int(PackIo::direct))->Arg(int(PackIo::uring))
    ->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
