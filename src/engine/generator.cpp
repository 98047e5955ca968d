// generate() implementation (see generator.h).
#include "engine/generator.h"

#include "core/error.h"
#include "engine/engine_core.h"

#include <chrono>

namespace moet {

GenerateResult generate(Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token) {
  const int64_t max_len =
      options.max_model_len > 0 ? options.max_model_len : model.config().max_position_embeddings;
  MOET_CHECK(int64_t(prompt.size()) + options.max_tokens <= max_len,
             "prompt ({} tokens) + max_tokens ({}) exceeds the maximum model length {}", prompt.size(),
             options.max_tokens, max_len);
  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_num_batched_tokens = options.prefill_chunk;
  config.max_model_len = int64_t(prompt.size()) + options.max_tokens;  // the KV cache holds this request
  config.block_size = options.block_size;
  config.enable_prefix_caching = false;
  config.speculative = options.speculative;
  EngineCore engine(model, std::nullopt, config);
  RequestParams params;
  params.prompt = prompt;
  params.sampling = options.sampling;
  params.max_tokens = options.max_tokens;
  params.stop_ids = options.stop_ids;
  params.prompt_logits = true;

  GenerateResult result;
  const ExpertResidency* residency = model.experts().residency();
  const ResidencyStats stats_before = residency ? residency->stats() : ResidencyStats{};
  const ExpertStoreCounters store_before = residency ? residency->store().counters() : ExpertStoreCounters{};
  const Fp4Tier* tier = model.experts().fp4_tier();
  const Fp4TierStats tier_before = tier ? tier->stats() : Fp4TierStats{};
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point first_token = start, last_token = start;
  engine.add(0, std::move(params), [&](RequestOutput&& out) {
    for (int32_t id : out.token_ids) {
      last_token = Clock::now();
      if (result.output_ids.empty()) first_token = last_token;
      result.output_ids.push_back(id);
      if (on_token) on_token(id);
    }
    if (!out.prompt_logits.empty()) result.prompt_logits = std::move(out.prompt_logits);
    if (out.finished) result.finish_reason = out.finish_reason;
  });
  while (engine.has_work()) engine.step();
  result.prefill_seconds = std::chrono::duration<double>(first_token - start).count();
  result.decode_seconds = std::chrono::duration<double>(last_token - first_token).count();
  if (residency) result.experts = expert_kpis(residency->stats(), stats_before, residency->store().counters(), store_before);
  result.speculative = engine.stats().speculative;
  if (tier) {
    result.fp4 = fp4_kpis(tier->stats(), tier_before);
    result.fp4->tau = tier->gate().tau();
  }
  return result;
}

}  // namespace moet
