// `moet inspect`: what a checkpoint folder holds — family, shapes that matter, parameter counts
// (total, active per token, routed-expert share), its MTP layer (speculative decoding's drafts)
// and every tensor's dtype and shape. Reads the headers only; no weights are loaded. With
// --config (a config.json alone, e.g. bench/configs/) the counts come from the config
// (models/param_count.h), the numbers a checkpoint of those shapes has.
#include "cli/commands.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/arch/arch.h"
#include "models/param_count.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

namespace moet::cli {
namespace {

std::string human(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B", double(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f}M", double(n) / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}K", double(n) / 1e3);
  return fmt::format("{}", n);
}

void print_config(const ModelConfig& config) {
  int64_t moe_layers = 0;
  for (bool moe : config.layer_is_moe) moe_layers += moe;
  std::printf("architecture: %s (model_type %s)\n", config.family.c_str(), config.model_type.c_str());
  std::printf("layers:       %lld (%lld MoE), hidden %lld, vocab %lld\n", (long long)config.num_hidden_layers,
              (long long)moe_layers, (long long)config.hidden_size, (long long)config.vocab_size);
  const char* attention = config.hc_mult > 0       ? "compressed sparse + sliding window (DeepSeek-V4)"
                          : config.index_topk > 0  ? "MLA + DeepSeek sparse attention"
                          : config.mla             ? "MLA"
                                                   : "GQA";
  std::printf("attention:    %s, %lld heads, %lld kv heads, rope %s (theta %g, dim %lld)\n", attention,
              (long long)config.num_attention_heads, (long long)config.num_key_value_heads, config.rope.type.c_str(),
              config.rope.theta, (long long)config.rope.dim);
  const char* scoring = config.scoring == RouterScoring::sigmoid        ? "sigmoid"
                        : config.scoring == RouterScoring::sqrtsoftplus ? "sqrtsoftplus"
                                                                        : "softmax";
  std::printf("experts:      %lld routed (top-%lld, %s), %lld shared, inner %lld\n",
              (long long)config.n_routed_experts, (long long)config.num_experts_per_tok, scoring,
              (long long)config.n_shared_experts, (long long)config.moe_intermediate_size);
}

// --config: the counts a checkpoint of these shapes has (the main model; MTP layers not counted).
void run_config(const std::string& path) {
  const ModelConfig config = model_config_parse(json_read_file(path));
  const ParamCounts counts = param_counts(config);
  std::printf("config:       %s\n", path.c_str());
  print_config(config);
  std::printf("parameters:   %s total, %s active per token, routed experts %.1f%% (from the config; MTP layers "
              "not counted)\n", human(counts.total).c_str(), human(counts.active()).c_str(),
              100.0 * double(counts.routed) / double(counts.total));
}

void run(const std::string& dir) {
  const Checkpoint checkpoint = Checkpoint::open(dir);
  const ModelConfig config = model_config_parse(checkpoint.config());
  const CheckpointCounts counts = param_counts(checkpoint, config);
  std::printf("model:        %s\n", dir.c_str());
  print_config(config);
  std::printf("parameters:   %s total, %s active per token, routed experts %.1f%%\n", human(counts.main.total).c_str(),
              human(counts.main.active()).c_str(),
              counts.main.total ? 100.0 * double(counts.main.routed) / double(counts.main.total) : 0.0);
  if (counts.mtp_tensors > 0) {
    std::printf("MTP:          %lld layer(s) from model.layers.%lld, %s parameters in %lld tensors "
                "(drafts for --speculative-config mtp)\n",
                (long long)config.num_nextn_predict_layers, (long long)config.num_hidden_layers,
                human(counts.mtp).c_str(), (long long)counts.mtp_tensors);
  } else if (config.num_nextn_predict_layers > 0) {
    std::printf("MTP:          config.json says %lld layer(s), but the checkpoint has no tensors for them\n",
                (long long)config.num_nextn_predict_layers);
  }
  std::printf("identity:     %s\n", checkpoint.identity().c_str());
  std::printf("tensors:      %zu\n", checkpoint.names().size());
  for (const auto& name : checkpoint.names()) {
    const HostTensor& info = checkpoint.get(name);
    std::printf("  %-64s %-8s %s\n", name.c_str(), std::string(dtype_name(info.dtype)).c_str(),
                info.shape_text().c_str());
  }
}

}  // namespace

void register_inspect(CLI::App& app, Actions& actions) {
  auto dir = std::make_shared<std::string>();
  auto config = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("inspect", "describe a model folder: architecture, parameters, tensors");
  auto* model = sub->add_option("--model", *dir, "model folder: config.json + *.safetensors");
  sub->add_option("--config", *config, "a config.json alone: architecture and parameter counts from its shapes")
      ->excludes(model);
  actions[sub] = [dir, config] {
    if (!config->empty()) return run_config(*config);
    if (dir->empty()) fail("inspect: give --model (a model folder) or --config (a config.json)");
    run(*dir);
  };
}

}  // namespace moet::cli
