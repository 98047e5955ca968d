// Single-request generation: drives an EngineCore with one request (chunked prefill of the prompt,
// then one decode step per token through the step runner, sampling each next token), until
// max_tokens, a stop id, or max_model_len. The KV cache holds exactly this request (and its
// lookahead slots with speculative decoding, which then produces several tokens per step).
#pragma once

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "experts/expert_kpis.h"
#include "experts/fp4_kpis.h"
#include "models/model.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace moet {

struct GenerateOptions {
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;
  int64_t block_size = 16;
  int64_t max_model_len = 0;    // 0: the config's max_position_embeddings
  int64_t prefill_chunk = 512;  // prompt tokens per step
  SpeculativeConfig speculative;
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::vector<float> prompt_logits;  // logits at the last prompt position
  std::string finish_reason;         // "length" | "stop"
  double prefill_seconds = 0.0;      // until the first token was sampled
  double decode_seconds = 0.0;       // from then to the last
  std::optional<ExpertKpis> experts; // the expert cache over this request (tiered experts only)
  std::optional<SpeculativeStats> speculative;  // with speculative decoding
  std::optional<Fp4Kpis> fp4;        // the FP4 tier and the gate over this request (with an FP4 tier only)
};

GenerateResult generate(Model& model, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace moet
