// Parameters of the model ops that every backend and kernel takes by value: the rope table and
// the router's settings. Plain data, built by models/ from the config (models/rope_table.h, the
// MoE block) and read by kernels/cpu and kernels/cuda alike.
#pragma once

#include <cstdint>
#include <vector>

namespace moet {

// Rotary position embedding: per-pair inverse frequencies and the cos/sin scale; halves
// (NeoX/Llama), interleaved pairs written de-interleaved (DeepSeek MLA) or interleaved pairs
// written in place (DeepSeek-V4), as kernels/cpu/rope.h describes.
struct RopeTable {
  std::vector<float> inv_freq;  // rot_dim / 2 entries
  float scale = 1.0f;           // multiplies cos and sin
  bool interleaved = false;
  bool pairs_in_place = false;  // with interleaved: each rotated pair stays where it was
};

// MoE routing (kernels/cpu/router.h says how each setting acts).
struct RouterParams {
  int64_t experts;
  int64_t top_k;
  bool sigmoid;               // false: softmax (unless sqrtsoftplus)
  bool normalize;             // renormalise the chosen weights to sum to 1
  float scaling = 1.0f;       // routed_scaling_factor
  int64_t groups = 1;
  int64_t top_groups = 1;
  const float* correction_bias = nullptr;  // [experts] or null
  // DeepSeek-V4: scores = sqrt(softplus(logits)), chosen and weighted as sigmoid scores are.
  bool sqrtsoftplus = false;
};

}  // namespace moet
