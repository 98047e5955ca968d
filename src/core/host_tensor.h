// A tensor in host memory as the loaders hand it to a backend: name, dtype, shape and a view of
// its bytes (a checkpoint file's read-only mapping, or a buffer its producer keeps alive until
// the upload returns). `file` names where it came from, for error messages.
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moet {

struct HostTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;
  size_t bytes;
  std::string file;

  int64_t numel() const;
  std::string shape_text() const;  // "[4, 8]"
};

}  // namespace moet
