// HostTensor helpers (see host_tensor.h).
#include "core/host_tensor.h"

#include <fmt/ranges.h>

namespace moet {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

std::string HostTensor::shape_text() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace moet
