// `moet generate`: load a model folder and generate tokens for one prompt, printing the text as
// it comes (ids when the folder has no tokenizer), or one JSON object with --json. With a
// tokenizer, --prompt is encoded with it and generation stops at its eos ids. --prompts-file runs
// many prompts (separated by blank lines) on one loaded model and prints one JSON line for each,
// exactly what one `--prompt P --json` run per prompt prints (each prompt starts from an empty
// cache; sampling restarts from --seed for every prompt).
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "engine/generator.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace moet::cli {
namespace {

struct GenerateFlags {
  ModelOptions model;
  SpeculativeOptions speculative;
  std::string prompt_ids;
  std::string prompt;
  std::string prompts_file;
  int64_t max_prompts = 0;
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

// The prompts of a file as `text.split("\n\n")` in Python after universal-newline reading
// (\r\n and \r become \n), dropping pieces that are only whitespace; each prompt is kept as
// written (no stripping), at most `max` of them (0 = all).
std::vector<std::string> read_prompts(const std::string& path, int64_t max) {
  std::ifstream in(path, std::ios::binary);
  MOET_CHECK(in.good(), "{}: cannot open", path);
  std::ostringstream raw;
  raw << in.rdbuf();
  std::string text;
  const std::string& r = raw.str();
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] != '\r') {
      text += r[i];
    } else {
      text += '\n';
      if (i + 1 < r.size() && r[i + 1] == '\n') ++i;
    }
  }
  std::vector<std::string> prompts;
  size_t begin = 0;
  while (begin <= text.size() && (max == 0 || int64_t(prompts.size()) < max)) {
    size_t end = text.find("\n\n", begin);
    if (end == std::string::npos) end = text.size();
    std::string piece = text.substr(begin, end - begin);
    if (piece.find_first_not_of(" \t\n\v\f\r\x1c\x1d\x1e\x1f") != std::string::npos) prompts.push_back(std::move(piece));
    begin = end + 2;
  }
  MOET_CHECK(!prompts.empty(), "{}: no prompts (prompts are separated by blank lines)", path);
  return prompts;
}

bool has_tokenizer(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.json.gz", "tiktoken.model"})
    if (std::filesystem::exists(std::filesystem::path(dir) / name)) return true;
  return false;
}

// acceptance_length (tokens per verify step), per-position acceptance rates and the counts.
nlohmann::json speculative_json(const SpeculativeStats& stats) {
  std::vector<double> rates;
  for (size_t i = 0; i < stats.drafted_per_position.size(); ++i) rates.push_back(stats.acceptance_rate(i));
  return {{"acceptance_length", stats.acceptance_length()},
          {"acceptance_rate_per_position", rates},
          {"verify_steps_with_drafts", stats.drafts},
          {"draft_tokens", stats.draft_tokens},
          {"accepted_tokens", stats.accepted_tokens},
          {"drafted_per_position", stats.drafted_per_position},
          {"accepted_per_position", stats.accepted_per_position}};
}

nlohmann::json result_json(const std::vector<int32_t>& prompt, const GenerateResult& result, double prefill_rate,
                           double decode_rate, const std::optional<Tokenizer>& tokenizer) {
  nlohmann::json out = {{"prompt_ids", prompt},
                        {"output_ids", result.output_ids},
                        {"finish_reason", result.finish_reason},
                        {"prefill_tokens_per_s", prefill_rate},
                        {"decode_tokens_per_s", decode_rate}};
  if (tokenizer) out["text"] = tokenizer->decode(result.output_ids, true);
  if (result.experts) out["experts"] = expert_kpi_json(*result.experts);
  if (result.speculative) out.update(speculative_json(*result.speculative));
  if (result.fp4) out["fp4"] = fp4_kpi_json(*result.fp4);
  return out;
}

double decode_rate_of(const GenerateResult& result) {
  return result.output_ids.size() > 1 && result.decode_seconds > 0
             ? double(result.output_ids.size() - 1) / result.decode_seconds : 0.0;
}

double prefill_rate_of(const GenerateResult& result, size_t prompt_tokens) {
  return result.prefill_seconds > 0 ? double(prompt_tokens) / result.prefill_seconds : 0.0;
}

GenerateOptions generate_options(const GenerateFlags& flags, const std::optional<Tokenizer>& tokenizer) {
  GenerateOptions options;
  options.max_tokens = flags.max_tokens;
  options.sampling = {flags.temperature, flags.top_p, flags.top_k, flags.seed};
  options.block_size = flags.block_size;
  options.speculative = flags.speculative.resolve();
  if (tokenizer) options.stop_ids = tokenizer->info().eos_ids;
  return options;
}

// --prompts-file: one JSON line per prompt, printed (and flushed) as each finishes.
void run_prompts_file(const GenerateFlags& flags, const std::optional<Tokenizer>& tokenizer) {
  MOET_CHECK(tokenizer.has_value(), "--prompts-file needs a tokenizer (tokenizer.json or tiktoken.model) in {}",
             flags.model.model_dir);
  const std::vector<std::string> texts = read_prompts(flags.prompts_file, flags.max_prompts);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : texts) prompts.push_back(tokenizer->encode(text));
  const GenerateOptions options = generate_options(flags, tokenizer);
  LoadedModel loaded = load_model(flags.model, 1, options.speculative.method == SpeculativeConfig::Method::mtp);
  if (loaded.follower()) return loaded.follow();  // node 0 runs the prompts
  for (const std::vector<int32_t>& prompt : prompts) {
    const GenerateResult result = generate(*loaded.model, prompt, options);
    const nlohmann::json out =
        result_json(prompt, result, prefill_rate_of(result, prompt.size()), decode_rate_of(result), tokenizer);
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
}

void run(const GenerateFlags& flags) {
  MOET_CHECK(int(!flags.prompt.empty()) + int(!flags.prompt_ids.empty()) + int(!flags.prompts_file.empty()) == 1,
             "give exactly one of --prompt-ids, --prompt or --prompts-file");
  MOET_CHECK(flags.max_prompts == 0 || !flags.prompts_file.empty(), "--max-prompts needs --prompts-file");
  std::optional<Tokenizer> tokenizer;
  if (has_tokenizer(flags.model.model_dir)) tokenizer = Tokenizer::from_dir(flags.model.model_dir);
  if (!flags.prompts_file.empty()) return run_prompts_file(flags, tokenizer);
  MOET_CHECK(flags.prompt.empty() || tokenizer.has_value(),
             "--prompt needs a tokenizer (tokenizer.json or tiktoken.model) in {}; use --prompt-ids",
             flags.model.model_dir);
  const std::vector<int32_t> prompt = tokenizer && !flags.prompt.empty() ? tokenizer->encode(flags.prompt)
                                                                         : parse_ids(flags.prompt_ids);
  const GenerateOptions options = generate_options(flags, tokenizer);
  LoadedModel loaded = load_model(flags.model, 1, options.speculative.method == SpeculativeConfig::Method::mtp);
  if (loaded.follower()) return loaded.follow();  // node 0 runs the prompt
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
  const double decode_rate = decode_rate_of(result);
  const double prefill_rate = prefill_rate_of(result, prompt.size());
  if (flags.json) {
    std::printf("%s\n", result_json(prompt, result, prefill_rate, decode_rate, tokenizer).dump().c_str());
  } else {
    if (detokenizer) std::fputs(detokenizer->finish().c_str(), stdout);
    std::printf("\n");
    std::fprintf(stderr, "prefill %.1f tok/s, decode %.1f tok/s (%s)", prefill_rate, decode_rate,
                 result.finish_reason.c_str());
    if (result.speculative) std::fprintf(stderr, ", acceptance length %.2f", result.speculative->acceptance_length());
    std::fprintf(stderr, "\n");
  }
}

}  // namespace

void register_generate(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* sub = app.add_subcommand(
      "generate", "generate tokens for one prompt, or a file of prompts on one loaded model (--device cpu or cuda)");
  flags->model.add_to(*sub);
  flags->speculative.add_to(*sub);
  sub->add_option("--prompt-ids", flags->prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  sub->add_option("--prompt", flags->prompt, "prompt text (tokenized with the model's tokenizer)");
  sub->add_option("--prompts-file", flags->prompts_file,
                  "file of prompt texts separated by blank lines (pieces that are only whitespace are skipped); "
                  "the model is loaded once and one JSON line per prompt is printed (as --json prints it)");
  sub->add_option("--max-prompts", flags->max_prompts, "with --prompts-file: only the first N prompts (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-tokens", flags->max_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  sub->add_option("--temperature", flags->temperature, "sampling temperature (0 = greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", flags->top_p, "nucleus sampling: keep the smallest set with this probability mass")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--top-k", flags->top_k, "keep only the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", flags->seed, "random seed for sampling (same seed, same output)");
  sub->add_option("--block-size", flags->block_size, "KV cache block size in tokens")->check(CLI::PositiveNumber);
  sub->add_flag("--json", flags->json,
                "print one JSON object: prompt_ids, output_ids, text (with a tokenizer), finish_reason, "
                "prefill_tokens_per_s, decode_tokens_per_s, with --speculative-config acceptance_length and "
                "acceptance_rate_per_position (--prompts-file always prints these, one line each)");
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
