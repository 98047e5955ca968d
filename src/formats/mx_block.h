// The block-of-32 formats moet stores experts in, with their float64 reference quantizers:
//   MXFP4: per 32 weights along K one UE8M0 scale byte (2^(b-127)) and 32 e2m1 nibbles, two per
//          byte, low nibble = even k. Row-major: codes [N, K/2], scales [N, K/32].
//   W2:    per 32 weights one UE8M0 scale byte and 32 2-bit codes, four per byte, code of k in bits
//          2*(k%4); code {0,1,2,3} -> level {-4,-1,+1,+4}. Codes [N, K/4], scales [N, K/32].
// Reference pipeline (ARCHITECTURE.md 1.1): exp = round(log2(amax/6)) clamped to [-127, 127]
// (-127 for a block with no nonzero finite value), y = v / 2^exp, e2m1 = RNE(y) saturating at 6;
// W2 maps |e2m1| in {0..2} -> 1, {3,4,6} -> 4 (i.e. |y| > 2.5 -> 4), sign kept; an exact zero
// takes its sign bit (ZeroSign::keep) or +1 for even k / -1 for odd k (ZeroSign::alternate).
// amax is over finite values; +-Inf saturates; NaN must be rejected by the caller.
#pragma once

#include <cstdint>
#include <string_view>

namespace moet {

inline constexpr int kMxBlock = 32;
inline constexpr float kW2Levels[4] = {-4.0f, -1.0f, 1.0f, 4.0f};

// How exact zeros of a tensor get their W2 sign. auto resolves per tensor to alt when fewer than
// 5% of its exact zeros carry the minority sign (e.g. an export that wrote every zero as +0).
enum class ZeroMode { automatic, sign, alt };
ZeroMode zero_mode_parse(std::string_view name);  // "auto" | "sign" | "alt"; throws otherwise
const char* zero_mode_name(ZeroMode mode);

// round(log2(amax / 6)) clamped to [-127, 127]; -127 when amax is 0.
int mx_block_exponent(double amax);
// Largest finite |v| over v[0, n) (0 when there is none).
double finite_amax(const double* v, int64_t n);

// One row of K values (K % 32 == 0). `exponents` (K/32, may be null) overrides the computed
// block exponent: MXFP4 sources keep their scales verbatim. Outputs are the packed row layouts.
void mxfp4_quantize_row(const double* v, int64_t K, const int* exponents, uint8_t* codes,
                        uint8_t* scales);
void w2_quantize_row(const double* v, int64_t K, const int* exponents, bool alternate_zeros,
                     uint8_t* codes, uint8_t* scales);

// W2 with each block's exponent chosen among e0 - 2 .. e0 + 1 (e0: the one w2_quantize_row would
// use) to minimise sum_k importance_k (v_k - w_k)^2 (importance null: uniform), each weight at
// its nearest level as there (exact zeros signed alike); e0 wins ties, then ascending. Same bytes
// layout as W2: `--w2-quantizer opt`.
void w2_opt_quantize_row(const double* v, int64_t K, const int* exponents, bool alternate_zeros,
                         const float* importance, uint8_t* codes, uint8_t* scales);

// Dequantize one row into float32 (exact: every level * 2^exp is a float32 value).
void mxfp4_dequant_row(const uint8_t* codes, const uint8_t* scales, int64_t K, float* out);
void w2_dequant_row(const uint8_t* codes, const uint8_t* scales, int64_t K, float* out);

}  // namespace moet
