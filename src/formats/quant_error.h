// How far a quantized tensor is from its source, for the study tool (`moet quantize-report`):
// relative RMSE sqrt(sum (w - q)^2 / sum w^2) and the importance-weighted one
// sqrt(sum_k imp_k (w - q)^2 / sum_k imp_k w^2) (imp: an imatrix vector per column; uniform when
// null, then both are equal), sums in float64 over the decoded source's finite values.
#pragma once

#include "formats/requant.h"

namespace moet {

struct QuantError {
  double rel_rmse = 0;
  double weighted_rel_rmse = 0;
};

QuantError quant_error(const SourceView& source, const BlockTensor& quantized, StoreFormat format,
                       const float* importance);

}  // namespace moet
