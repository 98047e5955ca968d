// quant_error() (see quant_error.h).
#include "formats/quant_error.h"

#include <cmath>

namespace moet {

QuantError quant_error(const SourceView& source, const BlockTensor& quantized, StoreFormat format,
                       const float* importance) {
  const std::vector<float> q = block_tensor_dequant(format, quantized);
  std::vector<double> row(static_cast<size_t>(source.cols));
  double err = 0, norm = 0, werr = 0, wnorm = 0;
  for (int64_t r = 0; r < source.rows; ++r) {
    source_row_f64(source, r, row.data());
    for (int64_t k = 0; k < source.cols; ++k) {
      const double v = row[size_t(k)], d = v - double(q[size_t(r * source.cols + k)]);
      if (!std::isfinite(v)) continue;
      const double w = importance ? double(importance[k]) : 1.0;
      err += d * d, norm += v * v, werr += w * d * d, wnorm += w * v * v;
    }
  }
  return {norm > 0 ? std::sqrt(err / norm) : 0.0, wnorm > 0 ? std::sqrt(werr / wnorm) : 0.0};
}

}  // namespace moet
