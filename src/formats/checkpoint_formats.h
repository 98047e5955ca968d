// Float64 reference quantizers for the formats checkpoints ship, used by `moet dequant` to show
// what a weight looks like in a format and by tests to build sources of every kind:
//   FP8 block: e4m3fn codes [N, K], scale_inv F32 [ceil(N/128), ceil(K/128)] with
//     s = f32(amax_block / 448) (1 for an all-zero block), code = e4m3(v / s); value = code * s.
//   NVFP4: e2m1 nibbles [N, K/2], e4m3 scale per 16 along K, F32 global scale g =
//     f32(amax_tensor / (448 * 6)) (1 for an all-zero tensor); block scale b = e4m3(amax16 / (6 g)),
//     code = e2m1(v / (b g)) (all codes zero, sign kept, when b = 0); value = code * b * g.
//   BF16 / F16: round-to-nearest-even of each value.
// amax is over finite values; +-Inf saturates; NaN is an error naming `name`.
#pragma once

#include "formats/source.h"

#include <cstdint>
#include <string>
#include <vector>

namespace moet {

struct Fp8BlockTensor {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
  SourceView view(std::string name = {}) const;
};

struct Nvfp4Tensor {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;  // e4m3 [rows, cols / 16]
  float global_scale = 1.0f;
  SourceView view(std::string name = {}) const;
};

Fp8BlockTensor fp8_block_quantize(const double* v, int64_t rows, int64_t cols, const std::string& name);
Nvfp4Tensor nvfp4_quantize(const double* v, int64_t rows, int64_t cols, const std::string& name);

// Decodes a whole source view to float64 row-major (rows * cols values).
std::vector<double> source_dequant(const SourceView& view);

}  // namespace moet
