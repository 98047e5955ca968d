// Teacher-forced scoring of a token sequence: the log-probability the model gives each next
// token, for perplexity and for comparing expert formats (the quality harness reads the logits).
// The sequence runs in chunks of `chunk` rows through the step runner over one paged KV cache,
// exactly as a chunked prefill: from the second chunk on, attention reads what earlier chunks
// wrote into the cache (in the cache's dtype). Or (decode_steps) one position per step, each step
// ending at its sequence's last known token as a decode step that samples does: what the FP4
// tier's manager and the confidence gate act on while generating (experts/fp4_tier.h). With a
// reference KV dtype, the same steps also run over a second cache of that dtype (same model, same
// weights) and every position's next-token distribution is compared with the reference's (KL
// divergence, top-1 agreement): the quality cost of the KV cache format (docs/kv.md).
#pragma once

#include "models/model.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace moet {

struct ScoreResult {
  std::vector<double> token_logprobs;  // [n - 1]: log p(ids[i + 1] | ids[0..i])
  std::vector<float> logits;           // [n - 1, vocab] when asked for, else empty
  // With a reference KV dtype: the reference run's token log-probabilities, and per position
  // KL(reference || this run) in nats and whether both runs' top-1 tokens agree.
  std::vector<double> reference_logprobs, kld;
  int64_t top1_agree = 0;
  double mean_nll() const;
  double perplexity() const;
  double reference_perplexity() const;
  double mean_kld() const;
};

ScoreResult score(Model& model, const std::vector<int32_t>& ids, bool keep_logits, int64_t chunk = 512,
                  int64_t block_size = 16, std::optional<KvDtype> reference_kv = std::nullopt,
                  bool decode_steps = false);

}  // namespace moet
