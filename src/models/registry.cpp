// model_load(): config family -> architecture spec (models/arch/) -> DecoderModel (see model.h).
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "models/arch/arch.h"

#include <fmt/ranges.h>

namespace moet {
namespace {

// The FP4 tier over the loaded model: its rows from a second loader (MXFP4, the pack file
// experts-fp4-*.pack beside the W2 one), or the base loader's own for a W2-format tier.
void start_fp4_tier(DecoderModel& model, const ModelConfig& config, WeightLoader& loader, ExpertLoader& experts,
                    const ModelLoadOptions& options) {
  if (options.fp4_tier->format == ExpertFormat::w2)
    return model.experts().start_fp4_tier(experts, loader, config.num_experts_per_tok);
  ModelLoadOptions fp4 = options;
  fp4.experts = ExpertMode::fp4;
  ExpertLoader rows(experts.checkpoint(), config, fp4);
  model.experts().start_fp4_tier(rows, loader, config.num_experts_per_tok);
}

// Builds a DecoderModel: common weights, then per layer the spec's attention and either the MoE
// block (its routed experts through `experts` into the model's pool) or the dense MLP
// (intermediate_size) as config.layer_is_moe says.
std::unique_ptr<Model> decoder_build(const ArchSpec& spec, const ModelConfig& config, WeightLoader& loader,
                                     ExpertLoader& experts, Backend& backend, const ModelLoadOptions& options) {
  auto model = std::make_unique<DecoderModel>(config, backend);
  if (options.tiering) {
    MOET_CHECK(options.experts != ExpertMode::native, "the expert cache holds W2 or FP4 experts, not --experts native");
    model->experts().plan_tiering(*options.tiering);
  }
  if (options.fp4_tier) {
    MOET_CHECK(options.experts == ExpertMode::w2, "the FP4 tier sits over W2 experts (--experts w2, not {})",
               expert_mode_name(options.experts));
    model->experts().plan_fp4_tier(*options.fp4_tier);
  }
  model->load_common(loader);
  Progress progress("loading layers", uint64_t(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string prefix = fmt::format("model.layers.{}.", l);
    DecoderLayer& layer = model->layers()[size_t(l)];
    layer.attention = spec.attention(config, loader, prefix + "self_attn.");
    layer.ffn = config.layer_is_moe[size_t(l)]
                    ? moe_load(config, loader, l, experts, model->experts())
                    : dense_mlp_load(loader, prefix + "mlp.", config.hidden_size, config.intermediate_size);
    progress.advance(1);
  }
  progress.finish();
  if (options.tiering) model->experts().start_tiering(experts, loader, config.num_experts_per_tok);
  if (options.fp4_tier) start_fp4_tier(*model, config, loader, experts, options);
  model->finish_load();
  return model;
}

}  // namespace

std::unique_ptr<Model> model_load(const Checkpoint& checkpoint, Backend& backend, LoadStats* stats,
                                  const ModelLoadOptions& options) {
  const ModelConfig config = model_config_parse(checkpoint.config());
  MOET_LOG_INFO("loading {} ({} layers, {} experts top-{}, experts as {}) from {} on {}", config.family,
                config.num_hidden_layers, config.n_routed_experts, config.num_experts_per_tok,
                expert_mode_name(options.experts), checkpoint.dir().string(), backend.name());
  WeightLoader loader(checkpoint, backend);
  ExpertLoader experts(&checkpoint, config, options);
  auto model = decoder_build(arch_for_family(config.family), config, loader, experts, backend, options);
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
  WeightLoader loader = WeightLoader::random(backend, seed, fp8_dense, options.dummy_zipf);
  ExpertLoader experts(nullptr, config, options);
  auto model = decoder_build(arch_for_family(config.family), config, loader, experts, backend, options);
  if (stats) *stats = loader.stats();
  return model;
}

}  // namespace moet
