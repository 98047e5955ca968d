// MoE routing: from router logits [rows, experts] to the top-k experts and their weights.
// softmax: probabilities over all experts, top-k, optional renormalisation (Mixtral, Qwen3).
// sigmoid: scores = sigmoid(logits); choice = scores + correction bias; groups ranked by the sum
// of their two best choices, the best topk_group groups kept, top-k over them; weights are the
// unbiased scores, optionally renormalised, times routed_scaling_factor (DeepSeek-V3, GLM).
// sqrtsoftplus (DeepSeek-V4): scores = sqrt(softplus(logits)), otherwise as sigmoid (no groups
// in practice). Ties keep the lower expert index. Output experts are in descending order of choice
// score. Hash routing (DeepSeek-V4's first layers) takes the experts from a token -> experts table
// instead and weights them by their sqrtsoftplus scores, renormalised and scaled.
#pragma once

#include "core/op_params.h"

#include <cstdint>

namespace moet {

void router_topk(const RouterParams& params, const float* logits, int64_t rows,
                 int32_t* expert_ids, float* weights);
// expert_ids[t, i] = table[tokens[t], i] (table [vocab, top_k]; a token outside the vocabulary or
// an id outside the layer gives -1 and weight 0); weights from sqrt_softplus(logits[t, id]).
void router_hash(const RouterParams& params, const float* logits, int64_t rows, const int32_t* tokens,
                 const int32_t* table, int64_t vocab, int32_t* expert_ids, float* weights);
// sqrt(softplus(x)), softplus(x) = x above 20 as torch computes it.
float sqrt_softplus(float x);

}  // namespace moet
