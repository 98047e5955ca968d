// MoE routing: from router logits [rows, experts] to the top-k experts and their weights.
// softmax: probabilities over all experts, top-k, optional renormalisation (Mixtral, Qwen3).
// sigmoid: scores = sigmoid(logits); choice = scores + correction bias; groups ranked by the sum
// of their two best choices, the best topk_group groups kept, top-k over them; weights are the
// unbiased scores, optionally renormalised, times routed_scaling_factor (DeepSeek-V3, GLM).
// Ties keep the lower expert index. Output experts are in descending order of choice score.
#pragma once

#include <cstdint>

namespace moet {

struct RouterParams {
  int64_t experts;
  int64_t top_k;
  bool sigmoid;               // false: softmax
  bool normalize;             // renormalise the chosen weights to sum to 1
  float scaling = 1.0f;       // routed_scaling_factor
  int64_t groups = 1;
  int64_t top_groups = 1;
  const float* correction_bias = nullptr;  // [experts] or null
};

void router_topk(const RouterParams& params, const float* logits, int64_t rows,
                 int32_t* expert_ids, float* weights);

}  // namespace moet
