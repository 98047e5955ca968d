// model_load(): config family -> architecture spec (models/arch/) -> DecoderModel (see model.h).
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "models/arch/arch.h"
#include "models/mtp.h"
#include "models/parallel_model.h"

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

// Layer l's attention (the spec's) and FFN: the MoE block (its routed experts through `experts`
// into the model's pool) or the dense MLP (intermediate_size).
void layer_blocks_load(const ArchSpec& spec, const ModelConfig& config, WeightLoader& loader, ExpertLoader& experts,
                       DecoderModel& model, int64_t l, bool moe, DecoderLayer& layer) {
  const std::string prefix = config.layer_name(l);
  layer.attention = spec.attention(config, loader, prefix + config.attention_block + ".", l);
  layer.ffn = moe ? moe_load(config, loader, l, experts, model.experts())
                  : dense_mlp_load(loader, prefix + "mlp.", config.hidden_size, config.intermediate_size);
}

// Builds a DecoderModel: common weights, then per layer its blocks, MoE where config.layer_is_moe
// says; with options.load_mtp the MTP layer after them (MoE when the checkpoint has a router there).
std::unique_ptr<Model> decoder_build(const ArchSpec& spec, const ModelConfig& config, WeightLoader& loader,
                                     ExpertLoader& experts, Backend& backend, const ModelLoadOptions& options) {
  const ParallelConfig parallel{options.shard.size, options.shard.expert_parallel};
  parallel_check(config, parallel);
  parallel_check(options, parallel);
  loader.set_shard(options.shard);
  if (options.load_mtp) {
    mtp_require(config, loader);
    MOET_CHECK(!options.tiering, "--speculative-config method mtp: the expert cache does not hold the MTP layer's "
                                 "experts yet; keep every expert resident (--expert-cache-gb 0)");
    MOET_CHECK(!options.fp4_tier, "--speculative-config method mtp: the FP4 tier does not cover the MTP layer's "
                                  "experts yet; leave --fp4-pool-gb / --fp4-pool-slots unset");
  }
  auto model = std::make_unique<DecoderModel>(config, backend, options.load_mtp);
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
  Progress progress("loading layers", uint64_t(config.num_hidden_layers + (options.load_mtp ? 1 : 0)));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    layer_blocks_load(spec, config, loader, experts, *model, l, config.layer_is_moe[size_t(l)],
                      model->layers()[size_t(l)]);
    progress.advance(1);
  }
  if (options.load_mtp) {
    const LoadStats before = loader.stats();
    const int64_t l = config.num_hidden_layers;
    DecoderLayer layer;
    const bool moe = loader.has(config.moe_prefix(l) + "gate.weight");
    layer_blocks_load(spec, config, loader, experts, *model, l, moe, layer);
    model->set_mtp(mtp_layer_load(config, loader, std::move(layer), model->embedding(), model->lm_head()));
    loader.count_as_mtp(before);
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
  MOET_LOG_INFO("loading {} ({} layers{}, {} experts top-{}, experts as {}) from {} on {}{}", config.family,
                config.num_hidden_layers, options.load_mtp ? " + MTP" : "", config.n_routed_experts,
                config.num_experts_per_tok, expert_mode_name(options.experts), checkpoint.dir().string(),
                backend.name(),
                options.shard.sharded() ? fmt::format(" (rank {} of {})", options.shard.rank, options.shard.size) : "");
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
  MOET_LOG_INFO("building {} with random weights ({} layers{}, {} experts top-{}, experts as {}) on {}", config.family,
                config.num_hidden_layers, options.load_mtp ? " + MTP" : "", config.n_routed_experts,
                config.num_experts_per_tok, expert_mode_name(options.experts), backend.name());
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
