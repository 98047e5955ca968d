// W2K decoding tables and the portable W2K dot product (w2_matmul.h; the format: formats/w2k.h).
// Per codeword: the grid's eight magnitudes h + 1/2, their signs, plus the shift +-1/4; per block
// the sum over its 32 weights times the scale.
#include "formats/w2k.h"
#include "kernels/cpu/w2_matmul.h"

namespace moet {
namespace {

W2kTables build_tables() {
  W2kTables t{};
  for (int a = 0; a < 256; ++a) {
    int sum = 0;
    for (int j = 0; j < 8; ++j) {
      const int h = (kW2kGrid[a] >> (2 * j)) & 3;
      t.magnitude[a][j] = float(h) + 0.5f;
      sum += h;
    }
    t.parity[a] = uint8_t(sum & 1);
  }
  for (int s = 0; s < 128; ++s) t.odd[s] = uint8_t(__builtin_parity(unsigned(s)));
  return t;
}

}  // namespace

const W2kTables& w2k_tables() {
  static const W2kTables tables = build_tables();
  return tables;
}

float scalar::dot_w2k(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k) {
  const W2kTables& t = w2k_tables();
  float total = 0;
  for (int64_t b = 0; b < k / 32; ++b) {
    float acc[2] = {0, 0};
    for (int v = 0; v < 4; ++v) {
      const uint32_t code = uint32_t(codes[8 * b + 2 * v]) | uint32_t(codes[8 * b + 2 * v + 1]) << 8;
      const uint32_t signs = w2k_signs(code, t);
      const float shift = code & 0x8000 ? -0.25f : 0.25f;
      const float* m = t.magnitude[code & 0xff];
      const float* xv = x + b * 32 + v * 8;
      for (int j = 0; j < 8; ++j) acc[j & 1] += ((signs >> j) & 1 ? shift - m[j] : shift + m[j]) * xv[j];
    }
    total += (acc[0] + acc[1]) * w2k_scale_to_float(scales[b]);
  }
  return total;
}

}  // namespace moet
