// MoE routing: from router logits [rows, experts] to the top-k experts and their weights.
// softmax: probabilities over all experts, top-k, optional renormalisation (Mixtral, Qwen3).
// sigmoid: scores = sigmoid(logits); choice = scores + correction bias; groups ranked by the sum
// of their two best choices, the best topk_group groups kept, top-k over them; weights are the
// unbiased scores, optionally renormalised, times routed_scaling_factor (DeepSeek-V3, GLM).
// Ties keep the lower expert index. Output experts are in descending order of choice score.
#pragma once

#include "core/op_params.h"

#include <cstdint>

namespace moet {

void router_topk(const RouterParams& params, const float* logits, int64_t rows,
                 int32_t* expert_ids, float* weights);

}  // namespace moet
