// `moet imatrix`: measures a model's importance matrix (io/imatrix.h) on a text. The model loads
// with dense experts (`--experts native`) and CUDA graphs off; the text is tokenized, cut into
// windows of --context-tokens and each window is scored teacher-forced (engine/scorer.h, through
// the step runner) while an ImatrixCollector observes every MoE layer. Prints a JSON summary.
// For W2K's LDLQ quantizer: --layer-moments F writes one input second-moment matrix per layer and
// input (io/layer_moments.h); --expert-moments F each expert's own (io/expert_moments.h), with
// --expert-moments-top N only each layer's N hottest: the text then runs twice, the first pass
// counting each expert's tokens, the second summing the chosen experts' matrices (the collector
// holds K^2 doubles per chosen expert and input, not per expert).
#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/scorer.h"
#include "experts/imatrix_collector.h"
#include "tokenizer/model_files.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

namespace moet::cli {
namespace {

struct ImatrixFlags {
  std::string model_dir, text_file, out, expert_moments, layer_moments;
  DeviceOptions device;
  int64_t max_tokens = 0;
  int64_t context_tokens = 1024;
  int64_t min_tokens = 8;
  int64_t expert_moments_top = 0;  // 0: every expert
};

// Scores the text's windows with `collector` observing every MoE layer; returns the windows run.
int64_t observe_text(Model& model, const std::vector<int32_t>& ids, int64_t window, ImatrixCollector& collector) {
  model.experts().set_observer(&collector);
  int64_t windows = 0;
  for (size_t begin = 0; begin + 1 < ids.size(); begin += size_t(window)) {
    const std::vector<int32_t> part(ids.begin() + ptrdiff_t(begin),
                                    ids.begin() + ptrdiff_t(std::min(ids.size(), begin + size_t(window))));
    if (part.size() < 2) break;
    score(model, part, false);
    MOET_LOG_INFO("imatrix: {} of {} tokens", begin + part.size(), ids.size());
    ++windows;
  }
  model.experts().set_observer(nullptr);
  return windows;
}

void run(ImatrixFlags flags) {
  const Tokenizer tokenizer = Tokenizer::from_dir(flags.model_dir);
  std::vector<int32_t> ids = tokenizer.encode(tok::read_file(flags.text_file));
  if (flags.max_tokens > 0 && int64_t(ids.size()) > flags.max_tokens) ids.resize(size_t(flags.max_tokens));
  MOET_CHECK(ids.size() >= 2, "--text-file {}: fewer than 2 tokens", flags.text_file);
  MOET_CHECK(flags.expert_moments_top == 0 || !flags.expert_moments.empty(),
             "--expert-moments-top chooses the experts of --expert-moments F: give it");
  ModelOptions options;
  options.model_dir = flags.model_dir;
  options.device = flags.device;
  options.device.cuda_graphs = "off";  // the collector reads each layer's routing on the host
  options.experts.experts = "native";
  LoadedModel loaded = load_model(options);
  Model& model = *loaded.model;
  const int64_t window = std::min(flags.context_tokens, model.config().max_position_embeddings);
  const bool every_expert = !flags.expert_moments.empty() && flags.expert_moments_top == 0;
  ImatrixCollector collector(model.config(), {.every = every_expert}, !flags.layer_moments.empty());
  const int64_t windows = observe_text(model, ids, window, collector);
  const std::string identity = loaded.checkpoint->identity();
  const Imatrix imatrix = collector.result(flags.min_tokens, int64_t(ids.size()), identity);
  const std::string hash = imatrix_write(flags.out, imatrix);
  if (every_expert) imatrix_second_moments_write(flags.expert_moments, imatrix);
  if (flags.expert_moments_top > 0) {  // the second pass, over the hottest experts only
    ImatrixCollector hottest(model.config(), hottest_experts(imatrix, flags.expert_moments_top, flags.min_tokens));
    observe_text(model, ids, window, hottest);
    imatrix_second_moments_write(flags.expert_moments, hottest.result(flags.min_tokens, int64_t(ids.size()), identity));
  }
  if (!flags.layer_moments.empty())
    layer_moments_write(flags.layer_moments, collector.layer_moments(int64_t(ids.size()), identity));
  int64_t fallback = 0;
  for (const auto& [layer, counts] : imatrix.expert_tokens)
    fallback += std::count_if(counts.begin(), counts.end(), [&](int32_t n) { return n < flags.min_tokens; });
  const nlohmann::json report = {{"tokens", ids.size()},           {"windows", windows},
                                 {"moe_layers", imatrix.layers.size()}, {"experts_at_layer_average", fallback},
                                 {"out", flags.out},               {"hash", hash}};
  std::printf("%s\n", report.dump().c_str());
}

}  // namespace

void register_imatrix(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<ImatrixFlags>();
  CLI::App* sub = app.add_subcommand(
      "imatrix", "measure the importance matrix of the routed experts on a text (for --imatrix of the quantizers)");
  sub->add_option("--model", flags->model_dir, "model folder: config.json + *.safetensors + tokenizer files")
      ->required();
  flags->device.add_to(*sub);
  sub->add_option("--text-file", flags->text_file, "text to run, tokenized with the model's tokenizer")->required();
  sub->add_option("--max-tokens", flags->max_tokens, "use only the first N tokens of the text (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--context-tokens", flags->context_tokens,
                  "tokens per window: the text runs as independent sequences of this length (at most the "
                  "model's maximum length)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 30));
  sub->add_option("--min-tokens", flags->min_tokens,
                  "experts routed fewer tokens than this take their layer's average")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--out", flags->out, "the importance matrix file to write (safetensors)")->required();
  sub->add_option("--expert-moments", flags->expert_moments,
                  "also write each expert's own input second moments E[x x^T] (gate_up: hidden x hidden, down: inner "
                  "x inner) and every expert's routed token count to this file: what --w2k-quantizer ldlq "
                  "--expert-moments rounds against (K x K floats per expert and input: see --expert-moments-top)");
  sub->add_option("--expert-moments-top", flags->expert_moments_top,
                  "--expert-moments for only the N experts of each MoE layer with most routed tokens (at least "
                  "--min-tokens); the text runs a second time to collect them (0 = every expert)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--layer-moments", flags->layer_moments,
                  "also write one input second-moment matrix E[x x^T] per MoE layer and input (gate_up: hidden x "
                  "hidden, down: inner x inner; the mean over the layer's routed tokens) to this file: what "
                  "--w2k-quantizer ldlq rounds against");
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
