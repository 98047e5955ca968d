// cuBLASLt GEMMs of dense_gemm.h. Layout: cuBLASLt is column-major, so the row-major product
// y [rows, n] = x [rows, k] w^T is computed as its transpose, y^T [n, rows] = w^T' x^T' with w
// read as a column-major [k, n] matrix transposed (op T) and x as column-major [k, rows] (op N):
// the "TN" layout the BF16 tensor-core kernels favour. A product over a tile of w's rows writes a
// block of y's columns: y offset by the tile's first row, its leading dimension still n.
#include "backend/cuda/dense_gemm.h"

#include "core/error.h"
#include "kernels/cuda/fp8_split.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>

namespace moet {
namespace {

void check(cublasStatus_t status, const char* what) {
  MOET_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt {} failed: cublasStatus_t {}", what, int(status));
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "descriptor attribute");
}

template <typename T>
void set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  check(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)), "preference attribute");
}

constexpr uint32_t kAlignment = 16;  // bytes every operand pointer has (DenseGemm::supports)
constexpr int64_t kFp8Block = 128;   // rows (and columns) of one FP8 block scale

}  // namespace

// One shape's descriptors and algorithms; `first` overwrites y (+ bias), `accumulate` adds into it.
struct DenseGemm::Plan {
  cublasLtMatmulDesc_t first = nullptr, accumulate = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t first_algo{}, accumulate_algo{};

  ~Plan() {
    for (cublasLtMatmulDesc_t d : {first, accumulate})
      if (d) cublasLtMatmulDescDestroy(d);
    for (cublasLtMatrixLayout_t l : {w, x, y})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

DenseGemm::DenseGemm(void* workspace, size_t workspace_bytes, void* weight_scratch, size_t weight_scratch_bytes)
    : workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      weight_scratch_(weight_scratch),
      weight_scratch_bytes_(weight_scratch_bytes) {
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "create");
  handle_ = handle;
}

DenseGemm::~DenseGemm() {
  plans_.clear();
  cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

bool DenseGemm::supports(const void* w, const float* bias, const float* y, int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignment == 0; };
  return k % 8 == 0 && aligned(w) && aligned(y) && (bias == nullptr || aligned(bias));
}

DenseGemm::Plan& DenseGemm::plan(const Shape& shape) {
  auto found = plans_.find(shape);
  if (found != plans_.end()) return *found->second;
  const auto [rows, n, k, y_stride, with_bias] = shape;
  auto p = std::make_unique<Plan>();
  check(cublasLtMatrixLayoutCreate(&p->w, CUDA_R_16BF, uint64_t(k), uint64_t(n), k), "layout");
  check(cublasLtMatrixLayoutCreate(&p->x, CUDA_R_16BF, uint64_t(k), uint64_t(rows), k), "layout");
  check(cublasLtMatrixLayoutCreate(&p->y, CUDA_R_32F, uint64_t(n), uint64_t(rows), y_stride), "layout");
  for (cublasLtMatmulDesc_t* desc : {&p->first, &p->accumulate}) {
    check(cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
    set(*desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(*desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  }
  if (with_bias) set(p->first, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);

  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes_));
  // No split-K reduction through atomics in the output (run-to-run determinism).
  set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
      uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
               CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    set(pref, attribute, kAlignment);
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const auto pick = [&](cublasLtMatmulDesc_t desc, cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t result{};
    int found_count = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, desc, p->w, p->x, p->y, p->y, pref, 1, &result, &found_count),
          "heuristic");
    MOET_CHECK(found_count > 0, "cuBLASLt has no algorithm for a {} x {} x {} BF16 GEMM", rows, n, k);
    algo = result.algo;
  };
  pick(p->first, p->first_algo);
  pick(p->accumulate, p->accumulate_algo);
  cublasLtMatmulPreferenceDestroy(pref);
  return *plans_.emplace(shape, std::move(p)).first->second;
}

void DenseGemm::run_terms(std::initializer_list<Term> terms, const float* bias, float* y, int64_t y_stride,
                          int64_t rows, int64_t n, int64_t k, cudaStream_t stream) {
  Plan& p = plan({rows, n, k, y_stride, bias != nullptr});
  if (bias != nullptr) set(p.first, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const float one = 1.0f, zero = 0.0f;
  bool first = true;
  for (const Term& t : terms) {
    check(cublasLtMatmul(handle, first ? p.first : p.accumulate, &one, t.w, p.w, t.x, p.x, first ? &zero : &one, y,
                         p.y, y, p.y, first ? &p.first_algo : &p.accumulate_algo, workspace_, workspace_bytes_,
                         stream),
          "matmul");
    first = false;
  }
}

void DenseGemm::run(const uint16_t* w, const uint16_t* x_pieces, const float* bias, float* y, int64_t rows,
                    int64_t n, int64_t k, cudaStream_t stream) {
  MOET_CHECK(reinterpret_cast<uintptr_t>(x_pieces) % kAlignment == 0, "GEMM activations not {}-byte aligned",
             kAlignment);
  const uint16_t *x_hi = x_pieces, *x_lo = x_pieces + rows * k;
  run_terms({{w, x_hi}, {w, x_lo}}, bias, y, n, rows, n, k, stream);
}

int64_t DenseGemm::fp8_tile_rows(int64_t k) const {
  return scratch_weights() / std::max<int64_t>(k, 1) / kFp8Block * kFp8Block;
}

void DenseGemm::run_fp8_block(const uint8_t* codes, const float* scales, const uint16_t* x_pieces, const float* bias,
                              float* y, int64_t rows, int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t tile = fp8_tile_rows(k);
  MOET_CHECK(tile > 0 && k % 8 == 0 && reinterpret_cast<uintptr_t>(x_pieces) % kAlignment == 0 &&
                 reinterpret_cast<uintptr_t>(codes) % kAlignment == 0,
             "FP8-block GEMM of k = {}: k must be a multiple of 8 and at most {} (128 rows of BF16 pieces in the "
             "scratch), the operands 16-byte aligned",
             k, scratch_weights() / kFp8Block);
  const uint16_t *x_hi = x_pieces, *x_lo = x_pieces + rows * k;
  auto* w_hi = static_cast<uint16_t*>(weight_scratch_);
  for (int64_t n0 = 0; n0 < n; n0 += tile) {
    const int64_t height = std::min(tile, n - n0);
    uint16_t* w_lo = w_hi + height * k;  // 16-byte aligned: k % 8 == 0
    cuda::fp8_block_split_bf16_launch(codes, scales, k, n0, height, w_hi, w_lo, stream);
    run_terms({{w_hi, x_hi}, {w_hi, x_lo}, {w_lo, x_hi}}, bias != nullptr ? bias + n0 : nullptr, y + n0, n, rows,
              height, k, stream);
  }
}

}  // namespace moet
