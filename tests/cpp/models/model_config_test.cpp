// config.json parsing on the real configs of shared/data (as checkpoints ship them), on the
// transformers-5 style (rope_parameters), and on bad input.
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/arch/arch.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moet {
namespace {

const std::filesystem::path kData = std::filesystem::path(MOET_SOURCE_DIR) / ".." / "shared" / "data";

ModelConfig parse_file(const std::string& relative) {
  return model_config_parse(json_read_file(kData / relative));
}

std::string error_of(const nlohmann::json& config) {
  try {
    model_config_parse(config);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, DeepSeekV3AsShipped) {
  const ModelConfig c = parse_file("deepseek-v3/DeepSeek-V3.config.json");
  EXPECT_EQ(c.family, "deepseek_v3");
  EXPECT_TRUE(c.mla);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_TRUE(c.has_correction_bias);
  EXPECT_EQ(c.scoring, RouterScoring::sigmoid);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.dim, 64);
  EXPECT_TRUE(c.rope.interleaved);
  ASSERT_EQ(c.layer_is_moe.size(), 61u);
  EXPECT_FALSE(c.layer_is_moe[2]);
  EXPECT_TRUE(c.layer_is_moe[3]);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.quantization_config.is_null());
  // softmax scale = 192^-0.5 * (0.1 * ln 40 + 1)^2
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scale(), mscale * mscale / std::sqrt(192.0), 1e-12);
  EXPECT_EQ(c.expert_tensor_names(3, 7).down, "model.layers.3.mlp.experts.7.down_proj.weight");
}

TEST(ModelConfig, KimiK2DispatchesThroughArchitectures) {
  const ModelConfig c = parse_file("kimi-k2/Kimi-K2-Instruct.config.json");
  EXPECT_EQ(c.family, "deepseek_v3");
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_group, 1);
}

TEST(ModelConfig, Qwen3MoeShapes) {
  const ModelConfig c = parse_file("qwen3/Qwen3-30B-A3B.config.json");
  EXPECT_EQ(c.family, "qwen3_moe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.n_routed_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.scoring, RouterScoring::softmax);
  for (bool moe : c.layer_is_moe) EXPECT_TRUE(moe);
  EXPECT_EQ(parse_file("qwen3/Qwen3-235B-A22B.config.json").num_hidden_layers, 94);
}

TEST(ModelConfig, MixtralNamesAndRouting) {
  const ModelConfig c = parse_file("mixtral/Mixtral-8x7B-v0.1.config.json");
  EXPECT_EQ(c.family, "mixtral");
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 14336);
  EXPECT_EQ(c.expert_tensor_names(0, 1).gate, "model.layers.0.block_sparse_moe.experts.1.w1.weight");
  EXPECT_EQ(c.expert_tensor_names(0, 1).up, "model.layers.0.block_sparse_moe.experts.1.w3.weight");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
}

TEST(ModelConfig, Transformers5RopeParametersStyle) {
  nlohmann::json c = json_read_file(kData / "qwen3/Qwen3-30B-A3B.config.json");
  const double theta = c["rope_theta"];
  c.erase("rope_theta");
  c.erase("rope_scaling");
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", theta}, {"factor", 4.0},
                          {"original_max_position_embeddings", 32768}};
  const ModelConfig m = model_config_parse(c);
  EXPECT_EQ(m.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(m.rope.theta, theta);
  EXPECT_DOUBLE_EQ(m.rope.factor, 4.0);
  EXPECT_EQ(m.rope.original_max_position_embeddings, 32768);
}

TEST(ModelConfig, UnknownFamilyNamesTheSupportedOnes) {
  const std::string message = error_of(json_read_file(kData / "minimax-m2/MiniMax-M2.7.config.json"));
  EXPECT_NE(message.find("unsupported model_type 'minimax_m2'"), std::string::npos) << message;
  EXPECT_NE(message.find("deepseek_v3"), std::string::npos) << message;
  EXPECT_NE(message.find("qwen3_moe"), std::string::npos) << message;
}

TEST(ModelConfig, BadFieldsAreNamed) {
  nlohmann::json c = json_read_file(kData / "mixtral/Mixtral-8x7B-v0.1.config.json");
  c["hidden_size"] = "4096";
  EXPECT_NE(error_of(c).find("'hidden_size' must be an integer"), std::string::npos);
  c.erase("hidden_size");
  EXPECT_NE(error_of(c).find("required field 'hidden_size' is missing"), std::string::npos);
  c = json_read_file(kData / "mixtral/Mixtral-8x7B-v0.1.config.json");
  c["num_experts_per_tok"] = 9;
  EXPECT_NE(error_of(c).find("num_experts_per_tok 9"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace moet
