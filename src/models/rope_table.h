// Builds the RopeTable a model's attention uses from its parsed rope settings.
#pragma once

#include "io/model_config.h"
#include "kernels/cpu/rope.h"

namespace moet {

RopeTable rope_table_build(const RopeConfig& rope);

}  // namespace moet
