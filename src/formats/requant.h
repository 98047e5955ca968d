// Requantization of a source expert matrix to the formats moet stores: W2 (the 2-bit base), W2K
// (the stronger 2-bit format, formats/w2k.h) and MXFP4 (the FP4 tier). Rows are decoded exactly
// to float64 (source.h) and quantized by the reference block functions (mx_block.h, w2k.h) or
// W2K's LDLQ (w2k_ldlq.h), so the bytes are identical for any thread count and equal to the
// float64 reference pipeline.
// MXFP4 sources keep their block scales verbatim in W2 and MXFP4 (W2K chooses its own scales).
// NaN anywhere in the source is an error naming the tensor. This is the API the engine calls
// when it loads a quantized checkpoint (`--experts w2|w2k|fp4`) and the pack builder calls per
// expert.
#pragma once

#include "core/thread_pool.h"
#include "formats/mx_block.h"
#include "formats/source.h"
#include "formats/w2k.h"
#include "formats/w2k_ldlq.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace moet {

// A row-major block-of-32 tensor [rows, cols]: W2 / W2K (2 bits per weight) or MXFP4 (4 bits per
// code), one scale byte per block (UE8M0; W2K: UE5M3).
struct BlockTensor {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> codes;   // rows * cols * bits / 8
  std::vector<uint8_t> scales;  // rows * cols / 32, UE8M0
};
using W2Tensor = BlockTensor;
using Fp4Tensor = BlockTensor;

enum class StoreFormat { w2, fp4, w2k };
const char* store_format_name(StoreFormat format);
StoreFormat store_format_parse(std::string_view name);  // "w2" | "fp4" | "w2k"
int store_format_bits(StoreFormat format);
uint64_t store_codes_bytes(StoreFormat format, int64_t rows, int64_t cols);
uint64_t store_scales_bytes(int64_t rows, int64_t cols);

// Exact zeros of the source, by sign (for the auto zero mode and the study tool).
struct ZeroCounts {
  uint64_t positive = 0;
  uint64_t negative = 0;
};
ZeroCounts source_zero_counts(const SourceView& source, ThreadPool& pool);
// auto -> alt when the minority sign holds < 5% of the exact zeros, else sign; others unchanged.
ZeroMode zero_mode_resolve(ZeroMode mode, const ZeroCounts& zeros);

// Calls row_fn(values, exponents, row) for every row with the row decoded exactly to float64;
// exponents are the verbatim block exponents of an MXFP4 source, else nullptr. Rows run in
// parallel; throws naming the tensor when the source holds NaN.
void source_for_each_row(const SourceView& source, ThreadPool& pool,
                         const std::function<void(const double*, const int*, int64_t)>& row_fn);

// How W2 picks its bytes: the reference pipeline (the default) or, in the same layout, each
// block's exponent chosen by importance-weighted error (w2_opt_quantize_row).
enum class W2Quantizer { reference, opt };
W2Quantizer w2_quantizer_parse(std::string_view name);  // "reference" | "opt"
const char* w2_quantizer_name(W2Quantizer quantizer);

// How W2K picks its bytes: each block's nearest codewords (the reference, weighted by an
// importance matrix when given) or, in the same format, BlockLDLQ against the input's second
// moments (w2k_ldlq.h; `--w2k-quantizer ldlq`).
enum class W2kQuantizer { reference, ldlq };
W2kQuantizer w2k_quantizer_parse(std::string_view name);  // "reference" | "ldlq"
const char* w2k_quantizer_name(W2kQuantizer quantizer);

// What a quantizer takes besides the source: W2's zero mode and quantizer; importance [cols]
// (an imatrix vector, io/imatrix.h) weighing each column's squared error in W2-opt and W2K (null:
// uniform; the reference W2 and MXFP4 ignore it); ldlq: W2K rounds by BlockLDLQ with this
// decomposition of its input's second moments (null: the reference W2K quantizer).
struct QuantizeOptions {
  ZeroMode zero_mode = ZeroMode::automatic;
  W2Quantizer w2_quantizer = W2Quantizer::reference;
  const float* importance = nullptr;
  const W2kLdlqFactor* ldlq = nullptr;
};

// Any stored format into caller memory (codes: store_codes_bytes, scales: store_scales_bytes).
void quantize_into(StoreFormat format, const SourceView& source, const QuantizeOptions& options, ThreadPool& pool,
                   uint8_t* codes, uint8_t* scales);
BlockTensor quantize(StoreFormat format, const SourceView& source, const QuantizeOptions& options, ThreadPool& pool);

// Quantize into caller memory (codes: store_codes_bytes, scales: store_scales_bytes).
void quantize_w2_into(const SourceView& source, ZeroMode mode, ThreadPool& pool, uint8_t* codes,
                      uint8_t* scales);
void quantize_fp4_into(const SourceView& source, ThreadPool& pool, uint8_t* codes,
                       uint8_t* scales);
W2Tensor quantize_w2(const SourceView& source, ZeroMode mode, ThreadPool& pool);
Fp4Tensor quantize_fp4(const SourceView& source, ThreadPool& pool);

// Dequantize a stored tensor to float32 row-major [rows, cols].
std::vector<float> block_tensor_dequant(StoreFormat format, const BlockTensor& tensor);

}  // namespace moet
