// `moet bench`: decode throughput of a model on the CPU or a GPU (--device; a folder, or a
// config.json with random weights and optionally fewer layers, so full-size shapes fit in memory)
// next to the copy bandwidth of the memory it computes from, measured by the backend in the same run. Bytes read per decode token = every weight except the embedding table, with
// routed experts counted top_k / n_experts (what one token reads); achieved bandwidth = that
// times tokens/s; the ratio to the backend's copy bandwidth (a STREAM-like multi-threaded copy on
// the CPU, a device-to-device copy on the GPU; bytes read + written) says how close decode is to
// the memory roofline.
#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/generator.h"
#include "io/checkpoint.h"
#include "models/weight_loader.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

namespace moet::cli {
namespace {

struct BenchFlags {
  std::string model_dir;
  std::string config_file;
  int64_t layers = 0;
  DeviceOptions device;
  ExpertOptions experts;
  int64_t prompt_tokens = 16;
  int64_t decode_tokens = 32;
  double copy_gib = 1.0;
  std::string json_out;
};

void run(const BenchFlags& flags) {
  MOET_CHECK(flags.model_dir.empty() != flags.config_file.empty(), "give exactly one of --model or --config");
  auto backend = backend_create(flags.device);
  const double copy_gbs = backend->copy_bandwidth(size_t(flags.copy_gib * double(1ull << 30)));
  std::fprintf(stderr, "copy bandwidth: %.2f GB/s (read + write, %s)\n", copy_gbs, backend->name().c_str());

  LoadStats stats;
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<Model> model;
  nlohmann::json config;
  if (!flags.model_dir.empty()) {
    checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(flags.model_dir));
    config = checkpoint->config();
    model = model_load(*checkpoint, *backend, &stats, flags.experts.resolve());
  } else {
    config = json_read_file(flags.config_file);
    if (flags.layers > 0) config["num_hidden_layers"] = flags.layers;
    model = model_load_random(config, *backend, 1234, &stats, flags.experts.resolve());
  }
  const ModelConfig& mc = model->config();
  const double routed_share = double(mc.num_experts_per_tok) / double(std::max<int64_t>(1, mc.n_routed_experts));
  const double bytes_per_token =
      double(stats.bytes - stats.embedding_bytes - stats.routed_bytes) + double(stats.routed_bytes) * routed_share;

  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < flags.prompt_tokens; ++i) prompt.push_back(int32_t((i * 7919) % mc.vocab_size));
  GenerateOptions options;
  options.max_tokens = flags.decode_tokens + 1;
  options.max_model_len = flags.prompt_tokens + options.max_tokens;
  const GenerateResult result = generate(*model, prompt, options);
  const double decode_tps = double(result.output_ids.size() - 1) / result.decode_seconds;
  const double prefill_tps = double(prompt.size()) / result.prefill_seconds;
  const double achieved_gbs = bytes_per_token * decode_tps / 1e9;
  nlohmann::json report = {
      {"model", flags.model_dir.empty() ? flags.config_file : flags.model_dir},
      {"family", mc.family},
      {"layers", mc.num_hidden_layers},
      {"backend", backend->name()},
      {"experts", flags.experts.experts},
      {"weights_gb", double(stats.bytes) / 1e9},
      {"bytes_per_decode_token", bytes_per_token},
      {"prefill_tokens_per_s", prefill_tps},
      {"decode_tokens_per_s", decode_tps},
      {"decode_gb_per_s", achieved_gbs},
      {"copy_gb_per_s", copy_gbs},
      {"decode_fraction_of_copy", achieved_gbs / copy_gbs},
  };
  std::printf("%s\n", report.dump(2).c_str());
  if (!flags.json_out.empty()) {
    FILE* out = std::fopen(flags.json_out.c_str(), "w");
    MOET_CHECK(out != nullptr, "{}: cannot write", flags.json_out);
    std::fprintf(out, "%s\n", report.dump(2).c_str());
    std::fclose(out);
  }
}

}  // namespace

void register_bench(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand("bench", "measure decode speed against the device's copy bandwidth");
  sub->add_option("--model", flags->model_dir, "model folder to benchmark");
  sub->add_option("--config", flags->config_file, "config.json to build with random weights (no files needed)");
  sub->add_option("--layers", flags->layers, "with --config: keep only this many layers (0 = all)")->check(CLI::NonNegativeNumber);
  flags->device.add_to(*sub);
  flags->experts.add_to(*sub);
  sub->add_option("--prompt-tokens", flags->prompt_tokens, "prompt length before decoding")->check(CLI::PositiveNumber);
  sub->add_option("--decode-tokens", flags->decode_tokens, "decode steps to time")->check(CLI::PositiveNumber);
  sub->add_option("--copy-gib", flags->copy_gib, "buffer size of the copy-bandwidth measurement in GiB")->check(CLI::PositiveNumber);
  sub->add_option("--json-out", flags->json_out, "also write the report to this file");
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
