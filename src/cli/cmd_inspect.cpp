// `moet inspect`: what a checkpoint folder holds — family, shapes that matter, parameter counts
// (total, active per token, routed-expert share), its MTP layer (speculative decoding's drafts)
// and every tensor's dtype and shape. Reads the headers only; no weights are loaded.
#include "cli/commands.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/arch/arch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <regex>

namespace moet::cli {
namespace {

struct ParamCounts {
  int64_t total = 0;       // every weight of the main model (MTP layers and scales excluded)
  int64_t routed = 0;      // routed experts
  int64_t mtp = 0;         // MTP / next-n layers (layer index >= num_hidden_layers)
  int64_t mtp_tensors = 0;
};

// Weights stored as packed FP4 (two values a byte) count two parameters per byte.
int64_t parameters_of(const HostTensor& info) {
  return info.dtype == DType::u8 ? 2 * info.numel() : info.numel();
}

bool is_scale(const std::string& name) {
  return name.find("scale") != std::string::npos && name.find("correction_bias") == std::string::npos;
}

ParamCounts count_parameters(const Checkpoint& checkpoint, const ModelConfig& config) {
  static const std::regex layer_index(R"(^model\.layers\.(\d+)\.)");
  ParamCounts counts;
  for (const auto& name : checkpoint.names()) {
    const HostTensor& info = checkpoint.get(name);
    std::smatch match;
    if (std::regex_search(name, match, layer_index) && std::stoll(match[1]) >= config.num_hidden_layers) {
      if (!is_scale(name)) counts.mtp += parameters_of(info);
      ++counts.mtp_tensors;
      continue;
    }
    if (is_scale(name)) continue;
    counts.total += parameters_of(info);
    if (name.find(".experts.") != std::string::npos) counts.routed += parameters_of(info);
  }
  return counts;
}

std::string human(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B", double(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f}M", double(n) / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}K", double(n) / 1e3);
  return fmt::format("{}", n);
}

void run(const std::string& dir) {
  const Checkpoint checkpoint = Checkpoint::open(dir);
  const ModelConfig config = model_config_parse(checkpoint.config());
  const ParamCounts counts = count_parameters(checkpoint, config);
  const int64_t active = counts.total - counts.routed +
                         counts.routed * config.num_experts_per_tok / std::max<int64_t>(1, config.n_routed_experts);
  int64_t moe_layers = 0;
  for (bool moe : config.layer_is_moe) moe_layers += moe;
  std::printf("model:        %s\n", dir.c_str());
  std::printf("architecture: %s (model_type %s)\n", config.family.c_str(), config.model_type.c_str());
  std::printf("layers:       %lld (%lld MoE), hidden %lld, vocab %lld\n", (long long)config.num_hidden_layers,
              (long long)moe_layers, (long long)config.hidden_size, (long long)config.vocab_size);
  std::printf("attention:    %s, %lld heads, %lld kv heads, rope %s (theta %g, dim %lld)\n",
              config.mla ? "MLA" : "GQA", (long long)config.num_attention_heads,
              (long long)config.num_key_value_heads, config.rope.type.c_str(), config.rope.theta,
              (long long)config.rope.dim);
  std::printf("experts:      %lld routed (top-%lld, %s), %lld shared, inner %lld\n",
              (long long)config.n_routed_experts, (long long)config.num_experts_per_tok,
              config.scoring == RouterScoring::sigmoid ? "sigmoid" : "softmax",
              (long long)config.n_shared_experts, (long long)config.moe_intermediate_size);
  std::printf("parameters:   %s total, %s active per token, routed experts %.1f%%\n", human(counts.total).c_str(),
              human(active).c_str(), counts.total ? 100.0 * double(counts.routed) / double(counts.total) : 0.0);
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
  CLI::App* sub = app.add_subcommand("inspect", "describe a model folder: architecture, parameters, tensors");
  sub->add_option("--model", *dir, "model folder: config.json + *.safetensors")->required();
  actions[sub] = [dir] { run(*dir); };
}

}  // namespace moet::cli
