// A tensor handle: dtype, shape and a pointer into storage owned by the backend that made it.
// Row-major and contiguous; a 2-D view [rows, cols] is what most ops take. Copies share storage.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moet {

struct Tensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::shared_ptr<void> storage;  // keeps the memory alive
  void* data = nullptr;

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
