// Teacher-forced scoring of a token sequence: the log-probability the model gives each next
// token, for perplexity and for comparing expert formats (the quality harness reads the logits).
// The sequence runs in chunks through the step runner over one paged KV cache, exactly as prefill,
// or (decode_steps) one position per step, each step ending at its sequence's last known token as
// a decode step that samples does: what the FP4 tier's manager and the confidence gate act on
// while generating (experts/fp4_tier.h).
#pragma once

#include "models/model.h"

#include <cstdint>
#include <vector>

namespace moet {

struct ScoreResult {
  std::vector<double> token_logprobs;  // [n - 1]: log p(ids[i + 1] | ids[0..i])
  std::vector<float> logits;           // [n - 1, vocab] when asked for, else empty
  double mean_nll() const;
  double perplexity() const;
};

ScoreResult score(Model& model, const std::vector<int32_t>& ids, bool keep_logits, int64_t chunk = 512,
                  int64_t block_size = 16, bool decode_steps = false);

}  // namespace moet
