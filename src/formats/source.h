// A read-only view of one expert matrix [rows, cols] in any source format a checkpoint ships
// (F32/F16/BF16, FP8 e4m3 with 128x128 block scales, NVFP4, MXFP4), and its exact float64
// decoding. Invariants: cols is a multiple of 32 (the W2/MXFP4 block) and, for the packed FP4
// formats, the data holds two e2m1 nibbles per byte, low nibble = even column. Every decoded value
// is exact in float64 (products of at most 4+4+24 significant bits), so everything built on
// source_row_f64 is independent of evaluation order and thread count.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <string>

namespace moet {

enum class SourceFormat { f32, f16, bf16, fp8_block, nvfp4, mxfp4 };

struct SourceView {
  SourceFormat format = SourceFormat::bf16;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  // fp8_block: scale_inv [ceil(rows/block_rows), ceil(cols/block_cols)] in scales_dtype (F32 or
  // BF16), value = e4m3 * scale_inv. nvfp4: e4m3 [rows, cols/16], value = e2m1 * scale *
  // global_scale. mxfp4: UE8M0 [rows, cols/32], value = e2m1 * 2^(scale - 127).
  const uint8_t* scales = nullptr;
  DType scales_dtype = DType::u8;
  double global_scale = 1.0;  // nvfp4 weight_scale_2
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  std::string name;  // for error messages
};

// A view of float32 values [rows, cols] (the engine's dequantized or computed weights).
SourceView source_view_f32(const float* data, int64_t rows, int64_t cols, std::string name = {});

const char* source_format_name(SourceFormat format);
// Throws moet::Error (naming the tensor) when the view is not usable: null pointers, cols not a
// multiple of 32, a non-finite or non-positive nvfp4 global scale, an unsupported scale dtype.
void source_validate(const SourceView& view);
// Bytes of data (not scales) the view covers: what requantization throughput is measured on.
uint64_t source_data_bytes(const SourceView& view);
// Decodes row `row` exactly into out[0, cols). NaN stays NaN (quantizers reject it).
void source_row_f64(const SourceView& view, int64_t row, double* out);
// For mxfp4 sources: the UE8M0 scale bytes of row `row` ([cols/32]); nullptr otherwise.
const uint8_t* source_row_mx_scales(const SourceView& view, int64_t row);

}  // namespace moet
