// Reference FP8-block and NVFP4 quantizers (see checkpoint_formats.h).
#include "formats/checkpoint_formats.h"

#include "core/error.h"
#include "formats/minifloat.h"
#include "formats/mx_block.h"

#include <algorithm>
#include <cmath>

namespace moet {
namespace {

void reject_nan(const double* v, int64_t n, const std::string& name) {
  for (int64_t i = 0; i < n; ++i) MOET_CHECK(!std::isnan(v[i]), "tensor {}: NaN at element {}", name, i);
}

}  // namespace

SourceView Fp8BlockTensor::view(std::string name) const {
  SourceView v;
  v.format = SourceFormat::fp8_block;
  v.rows = rows;
  v.cols = cols;
  v.data = codes.data();
  v.scales = reinterpret_cast<const uint8_t*>(scale_inv.data());
  v.scales_dtype = DType::f32;
  v.name = std::move(name);
  return v;
}

SourceView Nvfp4Tensor::view(std::string name) const {
  SourceView v;
  v.format = SourceFormat::nvfp4;
  v.rows = rows;
  v.cols = cols;
  v.data = codes.data();
  v.scales = scales.data();
  v.global_scale = global_scale;
  v.name = std::move(name);
  return v;
}

Fp8BlockTensor fp8_block_quantize(const double* v, int64_t rows, int64_t cols, const std::string& name) {
  reject_nan(v, rows * cols, name);
  constexpr int64_t B = 128;
  Fp8BlockTensor t;
  t.rows = rows;
  t.cols = cols;
  t.codes.resize(size_t(rows * cols));
  const int64_t br = (rows + B - 1) / B, bc = (cols + B - 1) / B;
  t.scale_inv.resize(size_t(br * bc));
  for (int64_t i = 0; i < br; ++i) {
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r1 = std::min(rows, (i + 1) * B), c1 = std::min(cols, (j + 1) * B);
      double amax = 0;
      for (int64_t r = i * B; r < r1; ++r) amax = std::max(amax, finite_amax(v + r * cols + j * B, c1 - j * B));
      const float s = amax > 0 ? float(amax / 448.0) : 1.0f;
      t.scale_inv[size_t(i * bc + j)] = s;
      for (int64_t r = i * B; r < r1; ++r)
        for (int64_t c = j * B; c < c1; ++c) t.codes[size_t(r * cols + c)] = e4m3_from_double(v[r * cols + c] / double(s));
    }
  }
  return t;
}

Nvfp4Tensor nvfp4_quantize(const double* v, int64_t rows, int64_t cols, const std::string& name) {
  reject_nan(v, rows * cols, name);
  MOET_CHECK(cols % 16 == 0, "tensor {}: NVFP4 needs K % 16 == 0", name);
  Nvfp4Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.codes.assign(size_t(rows * cols / 2), 0);
  t.scales.resize(size_t(rows * cols / 16));
  const double amax = finite_amax(v, rows * cols);
  t.global_scale = amax > 0 ? float(amax / (448.0 * 6.0)) : 1.0f;
  const double g = t.global_scale;
  for (int64_t b = 0; b < rows * cols / 16; ++b) {
    const double* block = v + b * 16;
    const uint8_t sb = e4m3_from_double(finite_amax(block, 16) / (6.0 * g));
    t.scales[size_t(b)] = sb;
    const double scale = e4m3_to_double(sb) * g;
    for (int64_t k = 0; k < 16; ++k) {
      const uint8_t nibble = scale > 0 ? e2m1_from_double(block[k] / scale)
                                       : uint8_t(std::signbit(block[k]) ? 8 : 0);
      t.codes[size_t((b * 16 + k) / 2)] |= uint8_t(nibble << (4 * (k & 1)));
    }
  }
  return t;
}

std::vector<double> source_dequant(const SourceView& view) {
  source_validate(view);
  std::vector<double> out(static_cast<size_t>(view.rows * view.cols));
  for (int64_t r = 0; r < view.rows; ++r) source_row_f64(view, r, out.data() + r * view.cols);
  return out;
}

}  // namespace moet
