// What a caller gives the engine for one generation (RequestParams) and what it gets back after
// every step that produced something for it (RequestOutput, a delta: new tokens and new text).
// The last output of a request has finished = true and a finish_reason; nothing follows it.
#pragma once

#include "engine/sampler.h"

#include <cstdint>
#include <string>
#include <vector>

namespace moet {

struct RequestParams {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;   // stop strings (need a tokenizer); not part of the output text
  std::vector<int32_t> stop_ids;   // stop token ids (eos included by the caller unless ignored)
  bool skip_special_tokens = true;
  // Return the whole logits row of the last prompt position with the first token (the step that
  // samples it then copies whole rows).
  bool prompt_logits = false;
};

struct RequestOutput {
  int64_t index = 0;                    // position of the request in its AsyncEngine::submit batch
  std::vector<int32_t> token_ids;       // new tokens (a stop id included)
  std::string text;                     // new text (stop strings and held-back text excluded)
  std::vector<SampleResult> logprobs;   // one per new token when sampling.logprobs >= 0
  std::vector<float> prompt_logits;     // [vocab] with the first token when params.prompt_logits
  bool finished = false;
  std::string finish_reason;            // "stop" | "length" | "abort" (when finished)
  std::string stop_reason;              // the stop string that matched, if any
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;        // so far
  int64_t cached_tokens = 0;            // prompt tokens served from the prefix cache
  double time = 0.0;                    // steady-clock seconds when the engine emitted it
};

}  // namespace moet
