// The model shape the imatrix and layer-moments file tests describe: 3 layers, MoE from layer 1,
// 2 experts, hidden 64, expert inner 32 (included from tests/cpp/io).
#pragma once

#include "io/model_config.h"

namespace moet::test {

inline ModelConfig small_moe_config() {
  ModelConfig c;
  c.num_hidden_layers = 3;
  c.layer_is_moe = {false, true, true};
  c.n_routed_experts = 2;
  c.hidden_size = 64;
  c.moe_intermediate_size = 32;
  return c;
}

}  // namespace moet::test
