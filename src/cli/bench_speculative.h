// `moet bench --speculative-config`: what speculative decoding's steps cost on this model and
// device, measured on the bench's sequences and KV cache after its decode passes: verify steps
// of j + 1 rows of every sequence (j = 1 .. k, each row returning its logits; keyed by rows per
// sequence) next to the bench's decode step and to a decode step with the row-invariant kernels a
// speculative engine runs (what row invariance costs plain decode), and for mtp a chained draft
// step (the MTP layer, one row per sequence). Each kind of step runs once untimed first (its CUDA
// graph's capture). From those it projects the decode tokens/s each acceptance length L = 1 .. k + 1
// would give at k (L tokens per cycle of one verify step and k draft steps). Acceptance itself
// needs real text: `moet generate --prompts-file F --speculative-config ... --json` reports it.
#pragma once

#include "engine/sequence_batch.h"
#include "engine/speculative.h"

#include <nlohmann/json.hpp>

namespace moet::cli {

// The sequences hold prompt_len + steps tokens with their KV (the bench's decode passes ran);
// decode_step_seconds is the bench's timed decode step.
nlohmann::json bench_speculative(SequenceBatch& sequences, const SpeculativeConfig& config, int64_t prompt_len,
                                 int64_t steps, double decode_step_seconds);

}  // namespace moet::cli
