// `moet tokenize`: encodes text with a model folder's tokenizer and prints the ids, for debugging
// prompts. --json prints {"ids": [...]}. --batch FILE.jsonl is the golden-test interface: each
// line is a JSON string (printed back as {"ids": with special tokens, "ids_plain": without}) or a
// JSON array of ids (printed back as {"text", "text_skip": decode without/with skipping special
// tokens, "stream": the concatenated IncrementalDetokenizer deltas}), one JSON line per input.
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <memory>

namespace moet::cli {

namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  std::string batch;
  bool json = false;
  bool no_special = false;
};

nlohmann::json batch_record(const Tokenizer& tokenizer, const nlohmann::json& input) {
  if (input.is_string()) {
    const std::string text = input.get<std::string>();
    return {{"ids", tokenizer.encode(text, true)}, {"ids_plain", tokenizer.encode(text, false)}};
  }
  MOET_CHECK(input.is_array(), "--batch lines must be a JSON string or an array of ids");
  const std::vector<int32_t> ids = input.get<std::vector<int32_t>>();
  IncrementalDetokenizer stream(tokenizer);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  return {{"text", tokenizer.decode(ids, false)}, {"text_skip", tokenizer.decode(ids, true)}, {"stream", streamed}};
}

void run_tokenize(const TokenizeArgs& args) {
  const Tokenizer tokenizer = Tokenizer::from_dir(args.model);
  if (!args.batch.empty()) {
    std::ifstream in(args.batch);
    MOET_CHECK(in.good(), "cannot open {}", args.batch);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      nlohmann::json input;
      try {
        input = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        fail("{}: invalid JSON line: {}", args.batch, e.what());
      }
      std::cout << batch_record(tokenizer, input).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << '\n';
    }
    return;
  }
  const auto ids = tokenizer.encode(args.text, !args.no_special);
  if (args.json) {
    std::cout << nlohmann::json{{"ids", ids}}.dump() << '\n';
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << '\n';
}

}  // namespace

void register_tokenize(CLI::App& app, Actions& actions) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "encode text with a model's tokenizer and print the ids");
  sub->add_option("--model", args->model, "model folder (tokenizer.json or tiktoken.model)")->required();
  auto* text = sub->add_option("--text", args->text, "text to encode");
  auto* batch = sub->add_option("--batch", args->batch, "JSONL file of strings to encode or id arrays to decode");
  text->excludes(batch);
  sub->add_flag("--json", args->json, "print {\"ids\": [...]}");
  sub->add_flag("--no-special", args->no_special, "do not add the post-processor's special tokens");
  actions[sub] = [args, text, batch] {
    MOET_CHECK(text->count() + batch->count() == 1, "tokenize needs --text or --batch");
    run_tokenize(*args);
  };
}

}  // namespace moet::cli
