// model_load(): config family -> architecture spec -> DecoderModel (see model.h, architectures.h).
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/model_config.h"
#include "models/architectures.h"

#include <fmt/ranges.h>

namespace moet {
namespace {

const ArchSpec& arch_for(const std::string& family) {
  for (const ArchSpec* spec : {&qwen3_moe_arch(), &deepseek_v3_arch(), &glm4_moe_arch(), &mixtral_arch()})
    if (spec->family == family) return *spec;
  fail("no architecture implementation for family '{}'", family);
}

}  // namespace

std::unique_ptr<Model> decoder_build(const ArchSpec& spec, const ModelConfig& config,
                                     WeightLoader& loader, Backend& backend) {
  auto model = std::make_unique<DecoderModel>(config, backend);
  model->load_common(loader);
  Progress progress("loading layers", uint64_t(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string prefix = fmt::format("model.layers.{}.", l);
    DecoderLayer& layer = model->layers()[size_t(l)];
    layer.attention = spec.attention(config, loader, prefix + "self_attn.");
    layer.ffn = config.layer_is_moe[size_t(l)]
                    ? moe_load(config, loader, l)
                    : dense_mlp_load(loader, prefix + "mlp.", config.hidden_size, config.intermediate_size);
    progress.advance(1);
  }
  progress.finish();
  return model;
}

std::unique_ptr<Model> model_load(const Checkpoint& checkpoint, Backend& backend, LoadStats* stats,
                                  const ModelLoadOptions& options) {
  const ModelConfig config = model_config_parse(checkpoint.config());
  MOET_LOG_INFO("loading {} ({} layers, {} experts top-{}, experts as {}) from {} on {}", config.family,
                config.num_hidden_layers, config.n_routed_experts, config.num_experts_per_tok,
                expert_mode_name(options.experts), checkpoint.dir().string(), backend.name());
  WeightLoader loader(checkpoint, backend);
  loader.set_experts(std::make_unique<ExpertLoader>(&checkpoint, config, options));
  auto model = decoder_build(arch_for(config.family), config, loader, backend);
  loader.report_unused();
  if (stats) *stats = loader.stats();
  return model;
}

std::unique_ptr<Model> model_load_random(const nlohmann::json& config_json, Backend& backend, uint64_t seed,
                                         LoadStats* stats, const ModelLoadOptions& options) {
  const ModelConfig config = model_config_parse(config_json);
  MOET_LOG_INFO("building {} with random weights ({} layers, {} experts top-{}, experts as {}) on {}", config.family,
                config.num_hidden_layers, config.n_routed_experts, config.num_experts_per_tok,
                expert_mode_name(options.experts), backend.name());
  // DeepSeek-V3-style configs mark their FP8-block checkpoints {"quant_method": "fp8", ...}.
  const bool fp8_dense = config.quantization_config.is_object() &&
                         config.quantization_config.value("quant_method", "") == "fp8";
  WeightLoader loader = WeightLoader::random(backend, seed, fp8_dense);
  loader.set_experts(std::make_unique<ExpertLoader>(nullptr, config, options));
  auto model = decoder_build(arch_for(config.family), config, loader, backend);
  if (stats) *stats = loader.stats();
  return model;
}

}  // namespace moet
