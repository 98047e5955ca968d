// KV cache capacity of the real model shapes in bench/configs/ (config.json only, no weights):
// bytes per token of every layer's slots for each --kv-cache-dtype (kv_layer_specs_for(), the
// specs model_load() gives) and the tokens 40 GiB holds. Prints the table docs/server.md shows
// ("KV cache capacity"); run: build/tests/cpp/models/moet_models_tests --gtest_filter='KvCapacity.*'
#include "io/checkpoint.h"
#include "models/arch/arch.h"
#include "models/model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace moet {
namespace {

const std::filesystem::path kConfigs = std::filesystem::path(MOET_SOURCE_DIR) / "bench" / "configs";

TEST(KvCapacity, TokensIn40GiBForEachDtypeAndBenchConfig) {
  const int64_t budget = int64_t(40) << 30;
  std::printf("| model (layers, KV per layer) | dtype | bytes per token | tokens in 40 GiB | sequences of the "
              "window |\n|---|---|---:|---:|---:|\n");
  for (const std::string name : {"DeepSeek-V3", "Qwen3-235B-A22B", "Qwen3-30B-A3B"}) {
    const ModelConfig config = model_config_parse(json_read_file(kConfigs / (name + ".config.json")));
    const std::string shape =
        config.mla ? fmt::format("{} layers, MLA latent {} + {}", config.num_hidden_layers, config.kv_lora_rank,
                                 config.qk_rope_head_dim)
                   : fmt::format("{} layers, {} KV heads x {}", config.num_hidden_layers, config.num_key_value_heads,
                                 config.head_dim);
    int64_t previous = 0;
    for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::nvfp4}) {
      if (dtype == KvDtype::nvfp4 && !config.mla) {
        EXPECT_THROW(kv_layer_specs_for(config, dtype), Error);  // GQA has no nvfp4 format
        continue;
      }
      const int64_t bytes = kv_bytes_per_token(kv_layer_specs_for(config, dtype));
      const int64_t tokens = budget / bytes;
      const std::string label = dtype == KvDtype::fp8_e4m3 ? "fp8 (e4m3 or e5m2)" : std::string(kv_dtype_name(dtype));
      std::printf("| %s (%s) | %s | %lld | %lld | %.1f |\n", name.c_str(), shape.c_str(), label.c_str(),
                  static_cast<long long>(bytes), static_cast<long long>(tokens),
                  double(tokens) / double(config.max_position_embeddings));
      EXPECT_GT(tokens, previous);
      previous = tokens;
    }
  }
  // The figures: DeepSeek-V3's 512 + 64 latent is 2,304 bytes a layer in FP32, 352 in nvfp4.
  const ModelConfig v3 = model_config_parse(json_read_file(kConfigs / "DeepSeek-V3.config.json"));
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(v3, KvDtype::f32)), 61 * 2304);
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(v3, KvDtype::nvfp4)), 61 * 352);
  const ModelConfig qwen = model_config_parse(json_read_file(kConfigs / "Qwen3-30B-A3B.config.json"));
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(qwen, KvDtype::bf16)), 48 * 2 * 4 * 128 * 2);
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(qwen, KvDtype::fp8_e5m2)), 48 * 2 * (4 * 128 + 4 * 4));
}

// GLM-5: every layer keeps its 512 + 64 latent and its indexer's 128-value key. DeepSeek-V4-Flash:
// every layer its 512-value kv row; a compressed sparse layer (21 of them) also its compressor's
// state (kv and gate of two series: 4 x 512) and entries (512) and its indexer's (4 x 128, 128); a
// heavily compressed one (20) its compressor's (2 x 512, 512). One slot per token in each cache.
TEST(KvCapacity, Glm5AndDeepSeekV4FlashBytesPerToken) {
  const ModelConfig glm = model_config_parse(json_read_file(kConfigs / "GLM-5.config.json"));
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(glm, KvDtype::bf16)), 78 * (576 + 128) * 2);
  const ModelConfig v4 = model_config_parse(json_read_file(kConfigs / "DeepSeek-V4-Flash.config.json"));
  const int64_t csa = 512 + 4 * 512 + 512 + 4 * 128 + 128, hca = 512 + 2 * 512 + 512;
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(v4, KvDtype::bf16)), (2 * 512 + 21 * csa + 20 * hca) * 2);
}

}  // namespace
}  // namespace moet
