// Past the expert cache on the GPU (docs/experts.md), to be run on the H200 before the gate in
// cli/model_options.cpp is lifted:
//   - host experts: a W2 / MXFP4 layer whose host entries the host computes (through the mailbox
//     poller, experts/host_experts.h) agrees with the CPU backend's same layer within the MoE
//     kernels' tolerance, for decode batches and for batches larger than the mailbox (ranges);
//     the CPU's own layer with host entries equals its full layer bit for bit;
//   - a tiered model with --cpu-experts on (graphs on): every decode logit within FP32 rounding of
//     the resident model on the GPU, the greedy tokens identical up to any near-tie, graphs replayed;
//   - exclusive tiering and next-layer prefetch: the residency scenarios memcmp-equal to the resident
//     model (they move bytes, not values);
//   - the write-back path: W2 tiles untiled give the rows back, and a slot exchange returns the
//     evicted row exactly while loading the new one.
// Each GPU case skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "../residency_scenarios.h"
#include "experts/host_experts.h"
#include "kernels/cuda/w2_tiles.h"

#include <cuda_runtime_api.h>

namespace moet::test {
namespace {

using namespace residency_test;

constexpr double kTol = 2e-5;  // the MoE kernels' agreement with the CPU (cuda_quant_test.cpp)

BackendFactory gpu() {
  return [] { return cuda_backend_create({0, 0.9, 0.0, true}); };
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed, int lo, int hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<uint8_t> out(n);
  for (auto& v : out) v = uint8_t(dist(rng));
  return out;
}

// One random expert as a host row [codes13 | scales13 | codes2 | scales2].
struct Row {
  ExpertRowLayout layout;
  std::vector<uint8_t> bytes;
};

Row random_row(ExpertFormat format, int64_t hidden, int64_t inner, uint64_t seed) {
  const int64_t bits = format == ExpertFormat::w2 ? 2 : 4;
  Row r;
  r.layout.codes13 = 0;
  r.layout.scales13 = uint64_t(2 * inner * hidden * bits / 8);
  r.layout.codes2 = r.layout.scales13 + uint64_t(2 * inner * hidden / 32);
  r.layout.scales2 = r.layout.codes2 + uint64_t(hidden * inner * bits / 8);
  r.layout.bytes = r.layout.scales2 + uint64_t(hidden * inner / 32);
  r.bytes = random_bytes(r.layout.bytes, seed, 0, 255);
  for (uint64_t i = r.layout.scales13; i < r.layout.codes2; ++i) r.bytes[i] = uint8_t(118 + r.bytes[i] % 8);
  for (uint64_t i = r.layout.scales2; i < r.layout.bytes; ++i) r.bytes[i] = uint8_t(118 + r.bytes[i] % 8);
  return r;
}

// The planes of a row as an expert of `backend` (uploaded as a resident load would).
ExpertWeights upload_row(Backend& b, ExpertFormat format, int64_t hidden, int64_t inner, const Row& r) {
  const int64_t bits = format == ExpertFormat::w2 ? 2 : 4;
  const auto plane = [&](uint64_t offset, uint64_t bytes, std::vector<int64_t> shape) {
    HostTensor info{"plane", DType::u8, std::move(shape), r.bytes.data() + offset, size_t(bytes), "test"};
    return b.upload(info);
  };
  return {plane(r.layout.codes13, r.layout.scales13, {2 * inner, hidden * bits / 8}),
          plane(r.layout.codes2, r.layout.scales2 - r.layout.codes2, {hidden, inner * bits / 8}), format,
          plane(r.layout.scales13, r.layout.codes2 - r.layout.scales13, {2 * inner, hidden / 32}),
          plane(r.layout.scales2, r.layout.bytes - r.layout.scales2, {hidden, inner / 32})};
}

// Serves a layer's host entries from the experts' rows with HostExperts::compute (what the
// residency does, without a store).
class RowServer final : public HostExpertServer {
 public:
  RowServer(HostExperts& host, const std::vector<Row>& rows, const std::vector<bool>& on_host)
      : host_(host), rows_(rows), on_host_(on_host) {}
  void serve(int64_t, const float* x, const int32_t* ids, const float*, int64_t rows, int64_t top_k, float* results,
             int32_t* valid) override {
    std::fill(valid, valid + rows * top_k, 0);
    for (size_t e = 0; e < rows_.size(); ++e) {
      if (!on_host_[e]) continue;
      std::vector<int64_t> items;
      for (int64_t i = 0; i < rows * top_k; ++i)
        if (ids[i] == int32_t(e)) items.push_back(i);
      host_.compute(rows_[e].bytes.data(), x, top_k, items, results);
      for (int64_t i : items) valid[i] = 1;
    }
  }

 private:
  HostExperts& host_;
  const std::vector<Row>& rows_;
  const std::vector<bool>& on_host_;
};

void check_host_layer(ExpertFormat format, int64_t experts, int64_t top_k, int64_t hidden, int64_t inner, int64_t rows,
                      int64_t mailbox_rows) {
  BackendPair p;
  std::vector<Row> host_rows;
  std::vector<bool> on_host(static_cast<size_t>(experts));
  std::vector<ExpertWeights> cpu_full, cpu_part, gpu_part;
  for (int64_t e = 0; e < experts; ++e) {
    host_rows.push_back(random_row(format, hidden, inner, 77 + uint64_t(e)));
    on_host[size_t(e)] = e % 3 == 1;
    cpu_full.push_back(upload_row(*p.cpu, format, hidden, inner, host_rows.back()));
    cpu_part.push_back(on_host[size_t(e)] ? ExpertWeights::on_host() : cpu_full.back());
    gpu_part.push_back(on_host[size_t(e)] ? ExpertWeights::on_host()
                                          : upload_row(*p.gpu, format, hidden, inner, host_rows.back()));
  }
  const ExpertLayout layout{format, hidden, inner};
  HostExperts cpu_host(*p.cpu, layout, host_rows[0].layout, 2, test_cpu_isa());
  HostExperts gpu_host(*p.gpu, layout, host_rows[0].layout, 2, test_cpu_isa());
  RowServer cpu_server(cpu_host, host_rows, on_host), gpu_server(gpu_host, host_rows, on_host);
  const std::vector<int64_t> layers = {0};
  gpu_host.open_mailboxes(layers, mailbox_rows, top_k, gpu_server);
  ExpertSet full = p.cpu->expert_set(layout, cpu_full);
  ExpertSet cpu_set = p.cpu->expert_set(layout, cpu_part);
  ExpertSet gpu_set = p.gpu->expert_set(layout, gpu_part);
  cpu_set.host = {&cpu_server, 0, {}};
  gpu_set.host = {&gpu_server, 0, gpu_host.mailbox(0)};
  const auto in = p.moe_inputs(rows, experts, top_k, hidden, uint64_t(rows * 13 + 1));
  auto out = p.alloc({rows, hidden});
  Tensor reference = p.cpu->alloc({rows, hidden});
  p.cpu->moe_experts(in.x.first, full, in.ids.first, in.weights.first, reference);
  p.cpu->moe_experts(in.x.first, cpu_set, in.ids.first, in.weights.first, out.first);
  gpu_host.begin_pass();
  p.gpu->moe_experts(in.x.second, gpu_set, in.ids.second, in.weights.second, out.second);
  const double diff = max_rel_diff(p, out);
  gpu_host.end_pass();
  const auto a = host(*p.cpu, out.first), b = host(*p.cpu, reference);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "the CPU's host entries are its own bits";
  EXPECT_LT(diff, kTol) << "rows " << rows << " mailbox " << mailbox_rows;
  std::printf("%s host layer experts %ld top-%ld hidden %ld inner %ld rows %ld (mailbox %ld): max rel |cuda - cpu| = "
              "%.3g\n", format == ExpertFormat::w2 ? "W2 " : "FP4", long(experts), long(top_k), long(hidden),
              long(inner), long(rows), long(mailbox_rows), diff);
}

TEST(CudaHostExperts, LayerWithHostEntriesMatchesTheCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (const ExpertFormat f : {ExpertFormat::w2, ExpertFormat::fp4}) {
    check_host_layer(f, 8, 2, 64, 32, 1, 1);
    check_host_layer(f, 16, 4, 256, 96, 5, 8);
    check_host_layer(f, 16, 4, 256, 96, 21, 8);  // three mailbox ranges
    check_host_layer(f, 8, 8, 7168, 2048, 1, 1);  // DeepSeek-V3's expert shape at batch 1
  }
}

// --cpu-experts on with graphs: decode logits within FP32 rounding of the resident model; the
// greedy tokens the same until a near-tie (where rounding may pick the other token).
TEST(CudaHostExperts, ModelWithinFp32RoundingOfResident) {
  MOET_SKIP_WITHOUT_GPU();
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  Loaded resident = load(gpu(), checkpoint, {}, std::nullopt);
  TieringConfig t = tiering(ExpertStoreKind::ram, 16);
  t.residency.cpu_experts = CpuExperts::on;
  t.residency.host_isa = test_cpu_isa();
  Loaded host = load(gpu(), checkpoint, {}, t);
  const std::vector<int32_t> p = prompt_for(*resident.model, 9, 4);
  const int64_t steps = 60;
  const Decoded want = greedy(*resident.model, p, steps), got = greedy(*host.model, p, steps);
  const int64_t vocab = resident.model->config().vocab_size;
  int64_t compared = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    const std::vector<float>& w = want.logits[i];
    double diff = 0, scale = 1;
    for (size_t j = 0; j < w.size(); ++j) {
      diff = std::max(diff, std::abs(double(w[j]) - double(got.logits[i][j])));
      scale = std::max(scale, std::abs(double(w[j])));
    }
    EXPECT_LT(diff / scale, 1e-4) << "step " << i;
    ++compared;
    if (argmax(w.data(), vocab) == argmax(got.logits[i].data(), vocab)) continue;
    std::vector<float> sorted = w;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    EXPECT_LT(sorted[0] - sorted[1], 1e-3 * scale) << "tokens differ at step " << i << " without a near-tie";
    break;  // the runs continue from different tokens
  }
  std::printf("--cpu-experts on: %ld steps compared\n", long(compared));
  const ExpertKpis k = host.model->experts().residency()->kpis();
  EXPECT_GT(k.host_pairs, 0);
  EXPECT_GT(host.backend->graph_stats().replays, 0) << "decode steps with host experts replay their graphs";
  EXPECT_EQ(host.backend->graph_stats().failures, 0);
}

// Exclusive tiering and prefetch move bytes only: the scenarios memcmp-equal to the resident model.
class CudaPastTheCache : public ::testing::TestWithParam<Case> {};

TEST_P(CudaPastTheCache, BitIdenticalToResident) {
  MOET_SKIP_WITHOUT_GPU();
  check_residency_scenarios(gpu(), GetParam());
}

std::vector<Case> cuda_cases() {
  const auto with = [](ExpertTiering tiering, ExpertPrefetch prefetch) {
    return [=](TieringConfig& t) {
      t.residency.tiering = tiering;
      t.residency.prefetch = prefetch;
    };
  };
  std::vector<Case> out;
  for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::arena})
    out.push_back({"models/tiny", store, 200, "exclusive", with(ExpertTiering::exclusive, ExpertPrefetch::off)});
  out.push_back({"models/tiny", ExpertStoreKind::ram, 200, "prefetch", with(ExpertTiering::inclusive,
                                                                            ExpertPrefetch::next_layer)});
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"})
    out.push_back({std::string("tests/fixtures/") + fixture, ExpertStoreKind::ram, 200, "exclusive",
                   with(ExpertTiering::exclusive, ExpertPrefetch::off)});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaPastTheCache, ::testing::ValuesIn(cuda_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const std::string& m = info.param.model;
                           return m.substr(m.rfind('/') + 1) + "_" + expert_store_name(info.param.store) + "_" +
                                  info.param.mode;
                         });

// W2 tiles back to the row's planes: the bytes the tiles were made from, padding left out.
TEST(CudaW2Untile, GivesTheRowBack) {
  MOET_SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols, gate_up] : {std::tuple<int64_t, int64_t, bool>{64, 96, true}, {32, 2080, false},
                                            {4096, 7168, true}, {7168, 2048, false}}) {
    const std::vector<uint8_t> codes = random_bytes(size_t(rows * cols / 4), 5, 0, 255);
    const std::vector<uint8_t> scales = random_bytes(size_t(rows * cols / 32), 6, 100, 140);
    const size_t tiled_bytes = cuda::w2_tile_shape(rows, cols).bytes();
    std::vector<void*> held;
    const auto device = [&](size_t bytes) {
      void* p = nullptr;
      EXPECT_EQ(cudaSuccess, cudaMalloc(&p, bytes));
      held.push_back(p);
      return static_cast<uint8_t*>(p);
    };
    uint8_t *d_codes = device(codes.size()), *d_scales = device(scales.size()), *d_tiled = device(tiled_bytes);
    uint8_t* d_back = device(codes.size() + scales.size());
    auto* d_bad = reinterpret_cast<int32_t*>(device(sizeof(int32_t)));
    cudaMemcpy(d_codes, codes.data(), codes.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_scales, scales.data(), scales.size(), cudaMemcpyHostToDevice);
    cudaMemset(d_bad, 0, sizeof(int32_t));
    cuda::w2_tile_launch(d_codes, d_scales, rows, cols, gate_up, d_tiled, d_bad, nullptr);
    cuda::w2_untile_launch(d_tiled, rows, cols, gate_up, d_back, d_back + codes.size(), nullptr);
    std::vector<uint8_t> back(codes.size() + scales.size());
    ASSERT_EQ(cudaSuccess, cudaMemcpy(back.data(), d_back, back.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, std::memcmp(back.data(), codes.data(), codes.size())) << rows << " x " << cols << " codes";
    EXPECT_EQ(0, std::memcmp(back.data() + codes.size(), scales.data(), scales.size())) << rows << " x " << cols;
    for (void* ptr : held) cudaFree(ptr);
  }
}

// A slot exchange returns the slot's expert as the row it was loaded from and leaves the new one
// there (exchanging back returns that one), W2 (tiled on the device) and MXFP4.
TEST(CudaExpertSlots, ExchangeReturnsTheEvictedRow) {
  MOET_SKIP_WITHOUT_GPU();
  auto backend = cuda_backend_create({});
  for (const ExpertFormat format : {ExpertFormat::w2, ExpertFormat::fp4}) {
    const int64_t hidden = 256, inner = 96, count = 40;  // three batches of the loads: a scratch half reused
    std::vector<Row> a, b;
    std::vector<std::shared_ptr<uint8_t>> pinned_a, pinned_b, out;
    std::vector<const uint8_t*> rows_a, rows_b;
    std::vector<uint8_t*> outs;
    std::vector<int64_t> ids;
    const auto pin = [&](const Row& r, std::vector<std::shared_ptr<uint8_t>>& keep, std::vector<const uint8_t*>& rows) {
      keep.push_back(backend->alloc_pinned(r.bytes.size()));
      std::memcpy(keep.back().get(), r.bytes.data(), r.bytes.size());
      rows.push_back(keep.back().get());
    };
    for (int64_t i = 0; i < count; ++i) {
      a.push_back(random_row(format, hidden, inner, 100 + uint64_t(i)));
      b.push_back(random_row(format, hidden, inner, 200 + uint64_t(i)));
      pin(a.back(), pinned_a, rows_a);
      pin(b.back(), pinned_b, rows_b);
      out.push_back(backend->alloc_pinned(a.back().bytes.size()));
      outs.push_back(out.back().get());
      ids.push_back(count - 1 - i);
    }
    ExpertSlots slots = backend->alloc_expert_slots({format, hidden, inner}, a[0].layout, count);
    backend->expert_slots_load(slots, ids, rows_a);
    backend->expert_slots_exchange(slots, ids, rows_b, outs);
    for (int64_t i = 0; i < count; ++i)
      EXPECT_EQ(0, std::memcmp(outs[size_t(i)], a[size_t(i)].bytes.data(), a[size_t(i)].bytes.size())) << i;
    backend->expert_slots_exchange(slots, ids, rows_a, outs);
    for (int64_t i = 0; i < count; ++i)
      EXPECT_EQ(0, std::memcmp(outs[size_t(i)], b[size_t(i)].bytes.data(), b[size_t(i)].bytes.size())) << i;
  }
}

}  // namespace
}  // namespace moet::test
