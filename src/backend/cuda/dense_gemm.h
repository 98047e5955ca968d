// Many-row products y = x @ w^T (+ bias) on the tensor cores through cuBLASLt, for BF16 weights
// [n, k] and FP32 activations [rows, k] (prefill, and decode batches at least
// CudaBackendOptions::gemm_min_rows rows). The activations keep near-FP32 accuracy: each is split
// into two BF16 pieces, hi = bf16(x) and lo = bf16(x - hi) (16 of FP32's 24 significand bits; the
// rest is below 2^-17 of |x|), and y = w hi^T + w lo^T is two BF16 GEMMs accumulating in FP32
// (the second adds into the first's output). The bias rides on the first GEMM's epilogue.
// Deterministic: one algorithm per shape (cuBLASLt's heuristic, asked once and cached), reductions
// without atomics. Not batch-invariant: a row's bits may depend on how many rows share the call,
// unlike the CUDA-core GEMV (gemv.h) that fewer rows take. Capturable in a CUDA graph: the
// workspace is allocated up front.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace moet {

class DenseGemm {
 public:
  // `workspace` (device memory, `workspace_bytes` long) is the GEMMs' scratch for their lifetime.
  DenseGemm(void* workspace, size_t workspace_bytes);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Whether run() takes these operands: k a multiple of 8 and 16-byte aligned pointers (the
  // activation pieces too, which the backend's allocator aligns to 256 bytes).
  static bool supports(const void* w, const float* bias, const float* y, int64_t k);
  // y [rows, n] = w [n, k] (BF16) times the activations, given as x_pieces [2, rows, k]: the BF16
  // hi pieces of every row, then the lo pieces (elementwise.h, split_bf16_launch); + bias [n] when
  // not null. Enqueued on `stream`.
  void run(const uint16_t* w, const uint16_t* x_pieces, const float* bias, float* y, int64_t rows, int64_t n,
           int64_t k, cudaStream_t stream);

 private:
  struct Plan;
  // rows, n, k, with bias
  using Shape = std::tuple<int64_t, int64_t, int64_t, bool>;
  Plan& plan(const Shape& shape);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Shape, std::unique_ptr<Plan>> plans_;
};

}  // namespace moet
