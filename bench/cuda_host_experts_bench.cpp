// GPU microbenchmark of the CUDA paths past the expert cache (docs/experts.md), DeepSeek-V3's W2
// expert shape (hidden 7168, inner 2048: 12.39 MB a row):
//   - slot loads and exchanges of 16 rows: expert_slots_load (host-to-device + tiling) against
//     expert_slots_exchange (untiling + device-to-host of the victims beside the host-to-device of
//     the new rows), in GB/s per direction, next to the pinned upload bandwidth of the same run;
//   - one MoE layer of 64 experts, top-8, batch 1, eager: every expert resident; the same with the
//     host link (publish, host poller, wait: the mailbox round trip, the host computing nothing);
//     and with every fourth expert computed on the host (HostExperts from their rows).
// Prints a table and writes JSON (argument 1, optional).
#ifdef MOET_HAVE_CUDA
#include "gpu_bench_start.h"
#include "experts/host_experts.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

namespace moet {
namespace {

constexpr int64_t kHidden = 7168, kInner = 2048, kExperts = 64, kTopK = 8, kRows = 16;

ExpertRowLayout w2_row() {
  ExpertRowLayout r;
  r.scales13 = uint64_t(2 * kInner * kHidden / 4);
  r.codes2 = r.scales13 + uint64_t(2 * kInner * kHidden / 32);
  r.scales2 = r.codes2 + uint64_t(kHidden * kInner / 4);
  r.bytes = r.scales2 + uint64_t(kHidden * kInner / 32);
  return r;
}

// `count` random W2 rows in pinned memory (scale bytes around 2^-4).
std::vector<std::shared_ptr<uint8_t>> random_rows(Backend& b, const ExpertRowLayout& r, int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::shared_ptr<uint8_t>> rows;
  for (int64_t e = 0; e < count; ++e) {
    rows.push_back(b.alloc_pinned(r.bytes));
    uint8_t* p = rows.back().get();
    for (uint64_t i = 0; i < r.bytes; ++i) p[i] = uint8_t(rng());
    for (uint64_t i = r.scales13; i < r.codes2; ++i) p[i] = uint8_t(119 + i % 4);
    for (uint64_t i = r.scales2; i < r.bytes; ++i) p[i] = uint8_t(119 + i % 4);
  }
  return rows;
}

std::vector<const uint8_t*> pointers(const std::vector<std::shared_ptr<uint8_t>>& rows) {
  std::vector<const uint8_t*> out;
  for (const auto& r : rows) out.push_back(r.get());
  return out;
}

template <typename F>
double best_seconds(int runs, F&& f) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// Serves the host entries of the layer from the experts' rows (the residency's serve() without a store).
class RowServer final : public HostExpertServer {
 public:
  RowServer(HostExperts& host, const std::vector<const uint8_t*>& rows, const std::vector<bool>& on_host)
      : host_(host), rows_(rows), on_host_(on_host) {}
  void serve(int64_t, const float* x, const int32_t* ids, const float*, int64_t rows, int64_t top_k, float* results,
             int32_t* valid) override {
    std::fill(valid, valid + rows * top_k, 0);
    for (size_t e = 0; e < rows_.size(); ++e) {
      if (!on_host_[e]) continue;
      std::vector<int64_t> items;
      for (int64_t i = 0; i < rows * top_k; ++i)
        if (ids[i] == int32_t(e)) items.push_back(i);
      host_.compute(rows_[e], x, top_k, items, results);
      for (int64_t i : items) valid[i] = 1;
    }
  }

 private:
  HostExperts& host_;
  const std::vector<const uint8_t*>& rows_;
  const std::vector<bool>& on_host_;
};

nlohmann::json bench_exchange(Backend& b) {
  const ExpertRowLayout r = w2_row();
  const ExpertLayout layout{ExpertFormat::w2, kHidden, kInner};
  ExpertSlots slots = b.alloc_expert_slots(layout, r, kRows);
  const auto a = random_rows(b, r, kRows, 1), c = random_rows(b, r, kRows, 2), out = random_rows(b, r, kRows, 3);
  std::vector<int64_t> ids(static_cast<size_t>(kRows));
  for (int64_t i = 0; i < kRows; ++i) ids[size_t(i)] = i;
  std::vector<uint8_t*> outs;
  for (const auto& o : out) outs.push_back(o.get());
  const double load = best_seconds(5, [&] { b.expert_slots_load(slots, ids, pointers(a)); });
  bool flip = false;
  const double exchange = best_seconds(5, [&] {
    b.expert_slots_exchange(slots, ids, pointers(flip ? a : c), outs);
    flip = !flip;
  });
  const double bytes = double(r.bytes) * kRows, upload = bench_ops(b).upload_bandwidth(size_t(1) << 30);
  std::printf("W2 rows x %ld (%.1f MB): load %.2f ms (%.1f GB/s in), exchange %.2f ms (%.1f GB/s each way); "
              "pinned upload %.1f GB/s\n", long(kRows), bytes / 1e6, load * 1e3, bytes / load / 1e9, exchange * 1e3,
              bytes / exchange / 1e9, upload);
  return {{"rows", kRows}, {"row_bytes", r.bytes}, {"load_ms", load * 1e3}, {"load_gb_per_s", bytes / load / 1e9},
          {"exchange_ms", exchange * 1e3}, {"exchange_gb_per_s_each_way", bytes / exchange / 1e9},
          {"upload_gb_per_s", upload}};
}

nlohmann::json bench_layer(Backend& b) {
  const ExpertRowLayout r = w2_row();
  const ExpertLayout layout{ExpertFormat::w2, kHidden, kInner};
  const auto rows = random_rows(b, r, kExperts, 4);
  ExpertSlots slots = b.alloc_expert_slots(layout, r, kExperts);
  std::vector<int64_t> ids(static_cast<size_t>(kExperts));
  for (int64_t i = 0; i < kExperts; ++i) ids[size_t(i)] = i;
  b.expert_slots_load(slots, ids, pointers(rows));
  std::vector<bool> on_host(static_cast<size_t>(kExperts)), none(static_cast<size_t>(kExperts), false);
  std::vector<ExpertWeights> part;
  for (int64_t e = 0; e < kExperts; ++e) {
    on_host[size_t(e)] = e % 4 == 1;
    part.push_back(on_host[size_t(e)] ? ExpertWeights::on_host() : slots.weights[size_t(e)]);
  }
  // One host (a mailbox and its poller) per linked layer: one that computes nothing, one that does.
  HostExperts idle_host(b, layout, r, 0, cpu_isa_best()), host(b, layout, r, 0, cpu_isa_best());
  const std::vector<const uint8_t*> host_rows = pointers(rows);
  RowServer computing(host, host_rows, on_host), idle(idle_host, host_rows, none);
  // Slots hold the device layout already: sets made empty, then pointed at them (as the residency does).
  const auto set_of = [&](const std::vector<ExpertWeights>& entries) {
    ExpertSet set = b.expert_set(layout, std::vector<ExpertWeights>(entries.size()));
    b.expert_set_update(set, ids, entries);
    return set;
  };
  ExpertSet resident = set_of(slots.weights), linked = set_of(slots.weights), mixed = set_of(part);
  const std::vector<int64_t> layers = {0};
  idle_host.open_mailboxes(layers, 1, kTopK, idle);
  host.open_mailboxes(layers, 1, kTopK, computing);
  linked.host = {&idle, 0, idle_host.mailbox(0)};
  mixed.host = {&computing, 0, host.mailbox(0)};
  std::mt19937 rng(5);
  std::vector<Tensor> routings;
  for (int k = 0; k < 8; ++k) {
    std::vector<int32_t> all(static_cast<size_t>(kExperts));
    for (int32_t e = 0; e < int32_t(kExperts); ++e) all[size_t(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    routings.push_back(b.alloc({1, kTopK}, DType::i32));
    b.from_host(all.data(), routings.back());
  }
  Tensor x = b.alloc({1, kHidden}), w = b.alloc({1, kTopK}), out = b.alloc({1, kHidden});
  const std::vector<float> half(size_t(kHidden), 0.5f);
  b.from_host(half.data(), x);
  b.from_host(half.data(), w);
  nlohmann::json results = nlohmann::json::object();
  idle_host.begin_pass();
  host.begin_pass();
  for (const auto& [name, set] : {std::pair<const char*, const ExpertSet*>{"resident", &resident},
                                  {"mailbox round trip", &linked}, {"every 4th on the host", &mixed}}) {
    int64_t call = 0;
    const double s = eager_seconds_per_call(b, out, 3, 20, [&] {
      b.moe_experts(x, *set, routings[size_t(call++ % 8)], w, out);
    });
    std::printf("MoE layer 64 x W2 %ldx%ld, top-%ld, batch 1, %-22s %8.1f us\n", long(kHidden), long(kInner),
                long(kTopK), name, s * 1e6);
    results[name] = s * 1e6;
  }
  host.end_pass();
  idle_host.end_pass();
  return {{"layer_us", results}, {"host_threads", host.threads()}};
}

}  // namespace
}  // namespace moet

int main(int argc, char** argv) {
  moet::CudaBenchStart start = moet::start_cuda_bench("cuda_host_experts_bench");
  if (!start.backend) return 0;
  nlohmann::json report = {{"device", start.backend->name()}, {"copy_gb_per_s", start.copy_gbs}};
  report["exchange"] = moet::bench_exchange(*start.backend);
  report["layer"] = moet::bench_layer(*start.backend);
  if (argc > 1) std::ofstream(argv[1]) << report.dump(2) << "\n";
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("cuda_host_experts_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif
