// Parameters of the model ops that every backend and kernel takes by value: the rope table and
// the router's settings. Plain data, built by models/ from the config (models/rope_table.h, the
// MoE block) and read by kernels/cpu and kernels/cuda alike.
#pragma once

#include <cstdint>
#include <vector>

namespace moet {

// Rotary position embedding: per-pair inverse frequencies and the cos/sin scale; halves
// (NeoX/Llama) or interleaved pairs (DeepSeek MLA) as kernels/cpu/rope.h describes.
struct RopeTable {
  std::vector<float> inv_freq;  // rot_dim / 2 entries
  float scale = 1.0f;           // multiplies cos and sin
  bool interleaved = false;
};

// MoE routing (kernels/cpu/router.h says how each setting acts).
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

}  // namespace moet
