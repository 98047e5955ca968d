// generate() implementation (see generator.h).
#include "engine/generator.h"

#include "core/error.h"
#include "engine/single_sequence.h"

#include <algorithm>
#include <chrono>

namespace moet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GenerateResult generate(Model& model, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options, const std::function<void(int32_t)>& on_token) {
  const ModelConfig& config = model.config();
  const int64_t max_len = options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
  const int64_t prompt_len = int64_t(prompt.size());
  MOET_CHECK(prompt_len > 0, "the prompt is empty");
  MOET_CHECK(options.max_tokens > 0, "max_tokens must be positive (got {})", options.max_tokens);
  for (int32_t id : prompt)
    MOET_CHECK(id >= 0 && id < config.vocab_size, "prompt token id {} is outside the vocabulary [0, {})", id, config.vocab_size);
  MOET_CHECK(prompt_len + options.max_tokens <= max_len,
             "prompt ({} tokens) + max_tokens ({}) exceeds the maximum model length {}", prompt_len,
             options.max_tokens, max_len);

  SingleSequence sequence(model, prompt_len + options.max_tokens, options.block_size);

  GenerateResult result;
  std::vector<int32_t> tokens = prompt;
  Sampler sampler(options.sampling);
  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits;
  for (int64_t begin = 0; begin < prompt_len; begin += options.prefill_chunk) {
    const int64_t end = std::min(prompt_len, begin + options.prefill_chunk);
    logits = sequence.forward(model, tokens, begin, end,
                              end == prompt_len ? std::vector<int32_t>{int32_t(end - begin - 1)} : std::vector<int32_t>{});
  }
  result.prompt_logits = logits;
  result.prefill_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  result.finish_reason = "length";
  for (int64_t step = 0; step < options.max_tokens; ++step) {
    if (step > 0) {
      const int64_t pos = int64_t(tokens.size()) - 1;
      logits = sequence.forward(model, tokens, pos, pos + 1, {0}, true);
    }
    const int32_t next = sampler.sample(logits.data(), config.vocab_size).token;
    tokens.push_back(next);
    result.output_ids.push_back(next);
    if (on_token) on_token(next);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace moet
