// A tensor handle: dtype, shape and a pointer into storage owned by the backend that made it.
// Row-major and contiguous; a 2-D view [rows, cols] is what most ops take. Copies share storage.
// An F8_E4M3 weight [n, k] (FP8-block, the DeepSeek-V3 checkpoint format) carries its F32 block
// scales [ceil(n/128), ceil(k/128)] in block_scales: element (i, j) is
// fp8_e4m3_to_float(code) * scales[i / 128][j / 128], exactly. Only matmul/matmul_group take it.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moet {

constexpr int64_t kFp8Block = 128;  // rows and columns of one FP8-block scale

struct Tensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::shared_ptr<void> storage;  // keeps the memory alive
  void* data = nullptr;
  std::shared_ptr<const Tensor> block_scales;  // FP8-block weights only (see above)

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[size_t(i < 0 ? int(shape.size()) + i : i)]; }
  int64_t rows() const { return shape.empty() ? 0 : numel() / shape.back(); }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

}  // namespace moet
