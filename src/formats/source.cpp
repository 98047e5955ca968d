// Exact float64 decoding of source expert matrices (see source.h).
#include "formats/source.h"

#include "core/error.h"
#include "formats/minifloat.h"

#include <array>
#include <cmath>
#include <cstring>

namespace moet {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

double fp8_block_scale(const SourceView& v, int64_t row, int64_t block_col) {
  const int64_t scale_cols = (v.cols + v.block_cols - 1) / v.block_cols;
  const int64_t index = (row / v.block_rows) * scale_cols + block_col;
  if (v.scales_dtype == DType::bf16) return bf16_to_float(load_u16(v.scales + 2 * index));
  float s;
  std::memcpy(&s, v.scales + 4 * index, 4);
  return s;
}

}  // namespace

SourceView source_view_f32(const float* data, int64_t rows, int64_t cols, std::string name) {
  SourceView v;
  v.format = SourceFormat::f32;
  v.rows = rows;
  v.cols = cols;
  v.data = reinterpret_cast<const uint8_t*>(data);
  v.name = std::move(name);
  return v;
}

const char* source_format_name(SourceFormat format) {
  switch (format) {
    case SourceFormat::f32: return "f32";
    case SourceFormat::f16: return "f16";
    case SourceFormat::bf16: return "bf16";
    case SourceFormat::fp8_block: return "fp8-block";
    case SourceFormat::nvfp4: return "nvfp4";
    case SourceFormat::mxfp4: return "mxfp4";
  }
  return "?";
}

void source_validate(const SourceView& v) {
  MOET_CHECK(v.data != nullptr && v.rows > 0 && v.cols > 0, "tensor {}: empty source view", v.name);
  // Packed FP4 sources come in blocks along K; the plain and FP8 ones decode at any K (dense
  // attention weights such as a [192, 48] q_b_proj). Quantizing to a block-of-32 format checks
  // K itself (source_for_each_row).
  if (v.format == SourceFormat::nvfp4 || v.format == SourceFormat::mxfp4)
    MOET_CHECK(v.cols % 32 == 0, "tensor {}: K = {} is not a multiple of 32", v.name, v.cols);
  switch (v.format) {
    case SourceFormat::fp8_block:
      MOET_CHECK(v.scales && (v.scales_dtype == DType::f32 || v.scales_dtype == DType::bf16),
                 "tensor {}: fp8 block scales must be F32 or BF16", v.name);
      MOET_CHECK(v.block_rows > 0 && v.block_cols > 0, "tensor {}: bad fp8 block size", v.name);
      break;
    case SourceFormat::nvfp4:
      MOET_CHECK(v.scales != nullptr, "tensor {}: nvfp4 without weight_scale", v.name);
      MOET_CHECK(std::isfinite(v.global_scale) && v.global_scale > 0,
                 "tensor {}: nvfp4 weight_scale_2 must be finite and positive", v.name);
      break;
    case SourceFormat::mxfp4:
      MOET_CHECK(v.scales != nullptr, "tensor {}: mxfp4 without scales", v.name);
      break;
    default:
      break;
  }
}

uint64_t source_data_bytes(const SourceView& v) {
  const uint64_t n = uint64_t(v.rows) * uint64_t(v.cols);
  switch (v.format) {
    case SourceFormat::f32: return 4 * n;
    case SourceFormat::f16:
    case SourceFormat::bf16: return 2 * n;
    case SourceFormat::fp8_block: return n;
    case SourceFormat::nvfp4:
    case SourceFormat::mxfp4: return n / 2;
  }
  return 0;
}

void source_row_f64(const SourceView& v, int64_t row, double* out) {
  const int64_t K = v.cols;
  switch (v.format) {
    case SourceFormat::f32: {
      const uint8_t* p = v.data + 4 * row * K;
      for (int64_t k = 0; k < K; ++k) {
        float f;
        std::memcpy(&f, p + 4 * k, 4);
        out[k] = f;
      }
      return;
    }
    case SourceFormat::f16: {
      const uint8_t* p = v.data + 2 * row * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_float(load_u16(p + 2 * k));
      return;
    }
    case SourceFormat::bf16: {
      const uint8_t* p = v.data + 2 * row * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_float(load_u16(p + 2 * k));
      return;
    }
    case SourceFormat::fp8_block: {
      static const auto lut = [] {
        std::array<double, 256> t{};
        for (int i = 0; i < 256; ++i) t[size_t(i)] = e4m3_to_double(uint8_t(i));
        return t;
      }();
      const uint8_t* p = v.data + row * K;
      for (int64_t k0 = 0; k0 < K; k0 += v.block_cols) {
        const double s = fp8_block_scale(v, row, k0 / v.block_cols);
        const int64_t k1 = std::min(K, k0 + v.block_cols);
        for (int64_t k = k0; k < k1; ++k) out[k] = lut[p[k]] * s;
      }
      return;
    }
    case SourceFormat::nvfp4:
    case SourceFormat::mxfp4: {
      const uint8_t* p = v.data + row * (K / 2);
      const int64_t group = v.format == SourceFormat::nvfp4 ? 16 : 32;
      const uint8_t* s = v.scales + row * (K / group);
      for (int64_t g = 0; g < K / group; ++g) {
        const double scale = v.format == SourceFormat::nvfp4
                                 ? e4m3_to_double(s[g]) * v.global_scale
                                 : (s[g] == 255 ? NAN : std::ldexp(1.0, ue8m0_exponent(s[g])));
        for (int64_t k = g * group; k < (g + 1) * group; ++k) {
          const uint8_t nibble = (p[k / 2] >> (4 * (k & 1))) & 0xf;
          out[k] = e2m1_to_double(nibble) * scale;
        }
      }
      return;
    }
  }
}

const uint8_t* source_row_mx_scales(const SourceView& v, int64_t row) {
  return v.format == SourceFormat::mxfp4 ? v.scales + row * (v.cols / 32) : nullptr;
}

}  // namespace moet
