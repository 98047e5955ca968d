// The importance matrix measured on the GPU (what `moet imatrix --device cuda` runs: native
// experts, CUDA graphs off, the collector observing every MoE layer) equals the CPU's within FP32
// rounding: the same routing (token counts per expert) and every vector within 1e-3 relative.
// Skips without a GPU.
#include "gpu_test_util.h"

#include "engine/scorer.h"
#include "experts/imatrix_collector.h"
#include "io/checkpoint.h"

#include <filesystem>

namespace moet::test {
namespace {

const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

Imatrix measure(Backend& backend, const Checkpoint& checkpoint) {
  ModelLoadOptions options;
  options.experts = ExpertMode::native;
  auto model = model_load(checkpoint, backend, nullptr, options);
  std::vector<int32_t> text;
  for (int i = 0; i < 96; ++i) text.push_back(int32_t((i * 53 + 7) % model->config().vocab_size));
  ImatrixCollector collector(model->config());
  model->experts().set_observer(&collector);
  score(*model, text, false, 32);
  model->experts().set_observer(nullptr);
  return collector.result(4, int64_t(text.size()), checkpoint.identity());
}

TEST(CudaImatrix, SameAsCpuWithinFp32Rounding) {
  MOET_SKIP_WITHOUT_GPU();
  for (const char* model : {"models/tiny", "tests/fixtures/qwen3_moe"}) {
    const Checkpoint checkpoint = Checkpoint::open(kSource / model);
    auto cpu = cpu_backend_create({2, test_cpu_isa()});
    CudaBackendOptions options;
    options.graphs = false;
    auto gpu = cuda_backend_create(options);
    const Imatrix a = measure(*cpu, checkpoint), b = measure(*gpu, checkpoint);
    ASSERT_EQ(a.expert_tokens, b.expert_tokens) << model << ": the routing differs";
    double worst = 0;
    for (const auto& [layer, experts] : a.layers) {
      for (size_t e = 0; e < experts.size(); ++e) {
        for (bool down : {false, true}) {
          const std::vector<float>& x = down ? experts[e].down_in : experts[e].gate_up_in;
          const std::vector<float>& y = down ? b.layers.at(layer)[e].down_in : b.layers.at(layer)[e].gate_up_in;
          ASSERT_EQ(x.size(), y.size());
          for (size_t k = 0; k < x.size(); ++k)
            worst = std::max(worst, std::fabs(double(x[k]) - double(y[k])) / std::max(1e-12, std::fabs(double(x[k]))));
        }
      }
    }
    EXPECT_LT(worst, 1e-3) << model;
    std::printf("%s: max relative |cuda - cpu| of the imatrix = %.3g\n", model, worst);
  }
}

}  // namespace
}  // namespace moet::test
