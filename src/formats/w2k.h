// W2K, moet's stronger 2-bit expert format (issue 31): an E8-lattice vector codebook ("E8P": the
// one QuIP# introduced, rebuilt from its rule) with an 8-bit non-power-of-two scale per 32
// weights. Exactly 2.25 bits per weight, the same plane sizes as W2 (codes [N, K/4], scales
// [N, K/32]), so packs, slots and residency treat a W2K row as bytes like a W2 row.
//
// Per block of 32 weights along K (K % 32 == 0):
//   scale  one UE5M3 byte b: (1 + m/8) 2^(e - 24) with e = b >> 3 >= 1, m = b & 7; e = 0 is
//          subnormal, m 2^-26 (b = 0: zero). Largest 240, smallest nonzero 2^-26.
//   codes  four little-endian uint16 codewords, codeword v covering weights 8v .. 8v + 7:
//          bits 0-7   a: index into kW2kGrid, 8 magnitudes h_j in {0, 1, 2} (bits 2j, 2j + 1)
//          bits 8-14  signs of weights 0..6 (1 = negative); weight 7's sign makes the number of
//                     negative signs have the parity of sum h_j (the E8 lattice's even sum)
//          bit 15     shift: 0 = +1/4, 1 = -1/4 on every weight
//   weight j = (sign_j (h_j + 1/2) + shift) * scale = q_j * scale / 4, q_j an odd integer in
//   [-11, 11]; q_j * scale has at most 8 significant bits, so every weight is exact in BF16 and
//   float32.
// kW2kGrid lists the 256 patterns of {1/2, 3/2, 5/2, 7/2}^8 of least norm (every one of norm^2
// <= 10 and the first 29 of norm^2 12), ordered by (norm, h_0, ..., h_7); the codewords are
// then 2^16 points of the E8 lattice (its D8 + 1/2 coset, even coordinate sum) shifted by +-1/4.
//
// Reference quantizer (float64, importance-weighted): per block, 11 candidate scales (the
// largest UE5M3 value <= amax / 2.75 * f, f = 0.75, 0.85, ..., 1.75: the range where 99.9% of
// the best scales of models/tiny's experts fell in a wider sweep); per candidate each 8-vector
// takes its exactly nearest codeword under sum_j imp_j (v_j - scale c_j)^2 (for each shift: round
// every coordinate to the nearest half-integer in [-5/2, 5/2] and fix the parity with the
// cheapest single step; if that pattern is outside the grid, search the grid's structure); the
// candidate with the least block error wins (the first on a tie; scale 0, every weight zero,
// stands unless a candidate is strictly better). +-Inf saturates to the block's largest finite
// magnitude; a block whose importance is zero everywhere is quantized unweighted. Rows are
// independent (thread-count invariant).
#pragma once

#include <cstdint>

namespace moet {

inline constexpr uint16_t kW2kGrid[256] = {
#include "formats/w2k_grid.inc"
};
// The largest |coordinate| of a codeword (5/2 + 1/4): the quantizers' scale candidates start
// from a block's amax / kW2kTopMagnitude.
inline constexpr double kW2kTopMagnitude = 2.75;

// The UE5M3 scale byte's value (exact in float32).
float w2k_scale_value(uint8_t byte);
// The largest UE5M3 byte whose value is <= target (0 when none; 255 above 240).
uint8_t w2k_scale_floor(double target);

// A block of 32 values with +-Inf saturated to the block's largest finite magnitude (2.75 x 240,
// the largest codeword at the largest scale, when it has none); returns that magnitude.
double w2k_saturate_block(const double* v, double* out);

// The codeword nearest to y (eight coordinates in units of the scale) under sum_j w_j (y_j - c_j)^2,
// exactly (the quantizer's search; *cost receives that sum).
uint16_t w2k_nearest(const double* y, const double* w, double* cost);

// The 8 weights of a codeword in quarter units (odd integers q_j: weight = q_j * scale / 4).
void w2k_decode(uint16_t code, int8_t q[8]);

// One row of K values; importance [K] weighs each column's squared error (null: uniform).
void w2k_quantize_row(const double* v, const float* importance, int64_t K, uint8_t* codes, uint8_t* scales);
void w2k_dequant_row(const uint8_t* codes, const uint8_t* scales, int64_t K, float* out);

}  // namespace moet
