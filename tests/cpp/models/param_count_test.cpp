// Parameter counts from a config (models/param_count.h) against the tensors of every fixture
// checkpoint (the same module's header count: packed FP4 codes two values a byte, scales and
// integer tables left out, MTP layers apart), so the formulas are the loaders' shapes; and the
// real shapes of bench/configs/ give the published sizes.
#include "io/checkpoint.h"
#include "models/arch/arch.h"
#include "models/param_count.h"

#include <gtest/gtest.h>

namespace moet {
namespace {

const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

TEST(ParamCount, ConfigFormulaEqualsEveryFixtureCheckpoint) {
  for (const char* name : {"qwen3_moe", "deepseek_v3", "deepseek_v3_plainq", "glm4_moe", "mixtral", "deepseek_v3_fp8",
                           "qwen3_moe_nvfp4", "mixtral_mxfp4", "glm_moe_dsa", "glm_moe_dsa_b", "deepseek_v4",
                           "deepseek_v4_b", "deepseek_v4_mxfp4"}) {
    const Checkpoint checkpoint = Checkpoint::open(kSource / "tests" / "fixtures" / name);
    const ModelConfig config = model_config_parse(checkpoint.config());
    const ParamCounts formula = param_counts(config);
    const CheckpointCounts tensors = param_counts(checkpoint, config);
    EXPECT_EQ(formula.total, tensors.main.total) << name;
    EXPECT_EQ(formula.routed, tensors.main.routed) << name;
    EXPECT_EQ(formula.active(), tensors.main.active()) << name;
    EXPECT_GT(formula.routed, 0) << name;
  }
}

// The published figures: GLM-5 744B (40B active), DeepSeek-V4-Flash 284B (13B active), DeepSeek-V3
// 671B (37B active); the counts leave out the MTP layers and the checkpoints' scales.
TEST(ParamCount, BenchConfigsHaveThePublishedSizes) {
  const auto billions = [](int64_t n) { return double(n) / 1e9; };
  const auto counts = [&](const char* file) {
    return param_counts(model_config_parse(json_read_file(kSource / "bench" / "configs" / file)));
  };
  const ParamCounts glm = counts("GLM-5.config.json"), v4 = counts("DeepSeek-V4-Flash.config.json"),
                    v3 = counts("DeepSeek-V3.config.json");
  EXPECT_NEAR(billions(v3.total), 671.0, 3.0);
  EXPECT_NEAR(billions(v3.active()), 37.5, 1.0);
  EXPECT_NEAR(billions(glm.total), 744.0, 8.0);
  EXPECT_NEAR(billions(glm.active()), 40.0, 2.0);
  EXPECT_NEAR(billions(v4.total), 284.0, 4.0);
  EXPECT_NEAR(billions(v4.active()), 13.0, 1.0);
}

}  // namespace
}  // namespace moet
