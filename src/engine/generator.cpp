// generate() implementation (see generator.h).
#include "engine/generator.h"

#include "core/error.h"
#include "kv/block_pool.h"

#include <algorithm>
#include <chrono>

namespace moet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One forward over tokens [begin, end) of `tokens`, returning the last row's logits if asked.
std::vector<float> run_rows(Model& model, KvCache& cache, const std::vector<int32_t>& table,
                            const std::vector<int32_t>& tokens, int64_t begin, int64_t end,
                            bool want_logits) {
  ForwardBatch batch;
  for (int64_t pos = begin; pos < end; ++pos) {
    batch.tokens.push_back(tokens[size_t(pos)]);
    batch.positions.push_back(int32_t(pos));
    batch.row_seq.push_back(0);
    batch.slots.push_back(int64_t(table[size_t(pos / cache.block_size)]) * cache.block_size + pos % cache.block_size);
  }
  batch.block_tables.push_back(table.data());
  if (want_logits) batch.logit_rows.push_back(int32_t(end - begin - 1));
  return model.forward(batch, cache);
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

  const int64_t total = prompt_len + options.max_tokens;
  KvBlockPool pool((total + options.block_size - 1) / options.block_size, options.block_size);
  KvCache cache = model.create_kv_cache(pool.total(), options.block_size);
  std::vector<int32_t> table;
  MOET_CHECK(pool.ensure(table, total), "KV pool too small");

  GenerateResult result;
  std::vector<int32_t> tokens = prompt;
  Sampler sampler(options.sampling);
  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits;
  for (int64_t begin = 0; begin < prompt_len; begin += options.prefill_chunk) {
    const int64_t end = std::min(prompt_len, begin + options.prefill_chunk);
    logits = run_rows(model, cache, table, tokens, begin, end, end == prompt_len);
  }
  result.prompt_logits = logits;
  result.prefill_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  result.finish_reason = "length";
  for (int64_t step = 0; step < options.max_tokens; ++step) {
    if (step > 0) {
      const int64_t pos = int64_t(tokens.size()) - 1;
      logits = run_rows(model, cache, table, tokens, pos, pos + 1, true);
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
  pool.release(table);
  return result;
}

}  // namespace moet
