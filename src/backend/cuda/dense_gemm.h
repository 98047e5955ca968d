// Many-row products y = x @ w^T (+ bias) on the tensor cores through cuBLASLt, for BF16 or
// FP8-block weights [n, k] and FP32 activations [rows, k] (prefill, and decode batches of at least
// CudaBackendOptions::gemm_min_rows rows), at near-FP32 accuracy through BF16 pieces: each
// activation is split into hi = bf16(x) and lo = bf16(x - hi) (16 of FP32's 24 significand bits;
// the rest is below 2^-17 of |x|).
// - BF16 weights: y = w hi^T + w lo^T, two BF16 GEMMs accumulating in FP32 (the second adds into
//   the first's output).
// - FP8-block weights (e4m3 codes, F32 scales per 128x128 block) stay FP8 in memory: a tile of
//   output rows at a time is decoded on the device to its exact F32 values w = code * scale and
//   split like the activations into w_hi + w_lo (kernels/cuda/fp8_split.h) into a scratch buffer
//   of bounded size, then y's columns of that tile = w_hi hi^T + w_hi lo^T + w_lo hi^T, three GEMMs
//   into y with its row stride n. The missing w_lo lo^T term is at most 2^-16 of |w| |x| per
//   product (|w_lo| <= 2^-8 |w|, |lo| <= 2^-8 |x|) and the pieces' remainders at most 2^-17 of
//   |w| |x| each, so a product is within 2^-15 of |w| |x| even in the worst case; in practice
//   these errors are much smaller (rounding remainders spread over their range) and of random
//   signs, so a sum of k products keeps near-FP32 accuracy (the tests hold it to the GEMV's 2e-5
//   of the largest output). A fourth GEMM would only halve the worst case.
// The bias rides on the first GEMM's epilogue. Deterministic: one algorithm per shape (cuBLASLt's
// heuristic, asked once and cached), reductions without atomics, tiles in a fixed order. Not
// batch-invariant: a row's bits may depend on how many rows share the call, unlike the CUDA-core
// GEMV (gemv.h) that fewer rows take. Capturable in a CUDA graph: the workspace and the weight
// scratch are allocated up front (the tiles of one call, and calls, reuse the scratch in stream
// order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <tuple>

namespace moet {

class DenseGemm {
 public:
  // `workspace` (device memory, `workspace_bytes` long) is the GEMMs' scratch for their lifetime;
  // `weight_scratch` (`weight_scratch_bytes`) holds the BF16 pieces of one tile of FP8-block weights.
  DenseGemm(void* workspace, size_t workspace_bytes, void* weight_scratch, size_t weight_scratch_bytes);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Whether run() and run_fp8_block() take these operands: k a multiple of 8 and 16-byte aligned
  // pointers (the activation pieces too, which the backend's allocator aligns to 256 bytes).
  static bool supports(const void* w, const float* bias, const float* y, int64_t k);
  // y [rows, n] = w [n, k] (BF16) times the activations, given as x_pieces [2, rows, k]: the BF16
  // hi pieces of every row, then the lo pieces (elementwise.h, split_bf16_launch); + bias [n] when
  // not null. Enqueued on `stream`.
  void run(const uint16_t* w, const uint16_t* x_pieces, const float* bias, float* y, int64_t rows, int64_t n,
           int64_t k, cudaStream_t stream);

  // The output rows of FP8-block weights of k columns that one scratch tile holds: a multiple of
  // 128 (so tiles start on block rows and keep y's, the bias's pointers 16-byte aligned); 0 when
  // not even 128 fit, and then run_fp8_block() does not take k.
  int64_t fp8_tile_rows(int64_t k) const;
  // As run(), with FP8-block weights: codes [n, k] and F32 scales [ceil(n/128), ceil(k/128)].
  void run_fp8_block(const uint8_t* codes, const float* scales, const uint16_t* x_pieces, const float* bias, float* y,
                     int64_t rows, int64_t n, int64_t k, cudaStream_t stream);

 private:
  struct Plan;
  // rows, n, k, y's row stride, with bias
  using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t, bool>;
  Plan& plan(const Shape& shape);
  // How many weights the scratch holds as 2 BF16 pieces.
  int64_t scratch_weights() const { return int64_t(weight_scratch_bytes_ / (2 * sizeof(uint16_t))); }
  // One GEMM's operands: BF16 weights [n, k] and activations [rows, k].
  struct Term {
    const uint16_t* w;
    const uint16_t* x;
  };
  // y [rows, n] (rows y_stride floats apart) = the sum of the terms' w x^T (+ bias), in order: the
  // first overwrites y (with the bias), the others add into it.
  void run_terms(std::initializer_list<Term> terms, const float* bias, float* y, int64_t y_stride, int64_t rows,
                 int64_t n, int64_t k, cudaStream_t stream);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_;
  size_t workspace_bytes_;
  void* weight_scratch_;
  size_t weight_scratch_bytes_;
  std::map<Shape, std::unique_ptr<Plan>> plans_;
};

}  // namespace moet
