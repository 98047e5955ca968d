// Parameter counts of a model from its config alone (`moet inspect --config`) or its checkpoint:
// the values of every weight the blocks of models/ load for the main model (embedding, LM head,
// norms, attention with its indexer / compressors, hyper-connections, dense MLPs, routers and
// their correction biases, shared and routed experts), without MTP layers, quantization scales or
// integer tables (hash routing's tid2eid). tests/cpp/models/param_count_test.cpp checks the
// formulas against the tensors of every fixture checkpoint, so they are the loaders' shapes.
#pragma once

#include "io/checkpoint.h"
#include "io/model_config.h"

#include <cstdint>

namespace moet {

struct ParamCounts {
  int64_t total = 0;   // the main model's weights
  int64_t routed = 0;  // of them, the routed experts'
  // Per token: everything but the routed experts, plus num_experts_per_tok of each MoE layer's.
  int64_t active() const;
  int64_t routed_per_layer_expert = 0;  // one routed expert of one layer
  int64_t moe_layers = 0;
  int64_t experts_per_token = 0;
};

ParamCounts param_counts(const ModelConfig& config);

// The same counts from a checkpoint's tensors (headers only): packed FP4 codes (U8, DeepSeek-V4's
// I8) count two values a byte; quantization scales and integer tables count nothing; MTP layers
// (layer index >= num_hidden_layers, DeepSeek-V4's "mtp.*") count apart.
struct CheckpointCounts {
  ParamCounts main;
  int64_t mtp = 0;          // MTP parameters
  int64_t mtp_tensors = 0;  // MTP tensors, scales included
};
CheckpointCounts param_counts(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace moet
