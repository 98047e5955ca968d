// `moet generate`: load a model folder and generate tokens for one prompt, printing the text as
// it comes (ids when the folder has no tokenizer), or one JSON object with --json. With a
// tokenizer, --prompt is encoded with it and generation stops at its eos ids.
#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/generator.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

namespace moet::cli {
namespace {

struct GenerateFlags {
  ModelOptions model;
  std::string prompt_ids;
  std::string prompt;
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int64_t block_size = 16;
  bool json = false;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      const long value = std::stol(item, &used);
      MOET_CHECK(used == item.size() && value >= 0 && value <= INT32_MAX, "bad token id '{}'", item);
      ids.push_back(int32_t(value));
    } catch (const std::logic_error&) {
      fail("--prompt-ids: '{}' is not a token id (expected comma-separated integers)", item);
    }
  }
  return ids;
}

bool has_tokenizer(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.json.gz", "tiktoken.model"})
    if (std::filesystem::exists(std::filesystem::path(dir) / name)) return true;
  return false;
}

void run(const GenerateFlags& flags) {
  MOET_CHECK(flags.prompt.empty() != flags.prompt_ids.empty(), "give exactly one of --prompt-ids or --prompt");
  std::optional<Tokenizer> tokenizer;
  if (has_tokenizer(flags.model.model_dir)) tokenizer = Tokenizer::from_dir(flags.model.model_dir);
  MOET_CHECK(flags.prompt.empty() || tokenizer.has_value(),
             "--prompt needs a tokenizer (tokenizer.json or tiktoken.model) in {}; use --prompt-ids",
             flags.model.model_dir);
  const std::vector<int32_t> prompt = tokenizer && !flags.prompt.empty() ? tokenizer->encode(flags.prompt)
                                                                         : parse_ids(flags.prompt_ids);
  LoadedModel loaded = load_model(flags.model);
  GenerateOptions options;
  options.max_tokens = flags.max_tokens;
  options.sampling = {flags.temperature, flags.top_p, flags.top_k, flags.seed};
  options.block_size = flags.block_size;
  if (tokenizer) options.stop_ids = tokenizer->info().eos_ids;
  std::optional<IncrementalDetokenizer> detokenizer;
  if (tokenizer) detokenizer.emplace(*tokenizer, true);
  auto print_token = [&](int32_t id) {
    if (flags.json) return;
    if (detokenizer) {
      std::fputs(detokenizer->push(id).c_str(), stdout);
    } else {
      std::printf("%d ", id);
    }
    std::fflush(stdout);
  };
  const GenerateResult result = generate(*loaded.model, prompt, options, print_token);
  const double decode_rate = result.output_ids.size() > 1 && result.decode_seconds > 0
                                 ? double(result.output_ids.size() - 1) / result.decode_seconds : 0.0;
  const double prefill_rate = result.prefill_seconds > 0 ? double(prompt.size()) / result.prefill_seconds : 0.0;
  if (flags.json) {
    nlohmann::json out = {{"prompt_ids", prompt},
                          {"output_ids", result.output_ids},
                          {"finish_reason", result.finish_reason},
                          {"prefill_tokens_per_s", prefill_rate},
                          {"decode_tokens_per_s", decode_rate}};
    if (tokenizer) out["text"] = tokenizer->decode(result.output_ids, true);
    std::printf("%s\n", out.dump().c_str());
  } else {
    if (detokenizer) std::fputs(detokenizer->finish().c_str(), stdout);
    std::printf("\n");
    std::fprintf(stderr, "prefill %.1f tok/s, decode %.1f tok/s (%s)\n", prefill_rate, decode_rate,
                 result.finish_reason.c_str());
  }
}

}  // namespace

void register_generate(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* sub = app.add_subcommand("generate", "generate tokens for one prompt (--device cpu or cuda)");
  flags->model.add_to(*sub);
  sub->add_option("--prompt-ids", flags->prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  sub->add_option("--prompt", flags->prompt, "prompt text (tokenized with the model's tokenizer)");
  sub->add_option("--max-tokens", flags->max_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  sub->add_option("--temperature", flags->temperature, "sampling temperature (0 = greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", flags->top_p, "nucleus sampling: keep the smallest set with this probability mass")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--top-k", flags->top_k, "keep only the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", flags->seed, "random seed for sampling (same seed, same output)");
  sub->add_option("--block-size", flags->block_size, "KV cache block size in tokens")->check(CLI::PositiveNumber);
  sub->add_flag("--json", flags->json,
                "print one JSON object: prompt_ids, output_ids, text (with a tokenizer), finish_reason, "
                "prefill_tokens_per_s, decode_tokens_per_s");
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
