// Reference block-of-32 quantizers (see mx_block.h). The exponent rule avoids log2: with
// amax/6 = m * 2^e (m in [1, 2)), round(log2) is e + (m >= sqrt 2); no double lies in
// [sqrt 2, fl(sqrt 2)), so comparing with the double nearest sqrt 2 is exact.
#include "formats/mx_block.h"

#include "core/error.h"
#include "formats/minifloat.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace moet {

ZeroMode zero_mode_parse(std::string_view name) {
  if (name == "auto") return ZeroMode::automatic;
  if (name == "sign") return ZeroMode::sign;
  if (name == "alt") return ZeroMode::alt;
  fail("unknown zero mode '{}' (expected auto|sign|alt)", name);
}

const char* zero_mode_name(ZeroMode mode) {
  switch (mode) {
    case ZeroMode::automatic: return "auto";
    case ZeroMode::sign: return "sign";
    case ZeroMode::alt: return "alt";
  }
  return "?";
}

int mx_block_exponent(double amax) {
  if (!(amax > 0)) return -127;
  int e;
  const double m = 2 * std::frexp(amax / 6.0, &e);  // amax/6 = m * 2^(e-1), m in [1, 2)
  const int n = (e - 1) + (m >= 1.4142135623730951 ? 1 : 0);
  return std::clamp(n, -127, 127);
}

double finite_amax(const double* v, int64_t n) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(v[i]);
    amax = std::max(amax, a == INFINITY ? 0.0 : a);
  }
  return amax;
}

namespace {

// Block exponent and the exact factor 2^-exp for block b of a row.
double block_inverse_scale(const double* v, const int* exponents, int64_t b, uint8_t* scale) {
  const int e = exponents ? exponents[b] : mx_block_exponent(finite_amax(v + b * kMxBlock, kMxBlock));
  *scale = ue8m0_from_exponent(e);
  return std::bit_cast<double>(uint64_t(1023 - e) << 52);  // 2^-e, |e| <= 127
}

}  // namespace

void mxfp4_quantize_row(const double* v, int64_t K, const int* exponents, uint8_t* codes,
                        uint8_t* scales) {
  for (int64_t b = 0; b < K / kMxBlock; ++b) {
    const double inv = block_inverse_scale(v, exponents, b, &scales[b]);
    for (int64_t k = b * kMxBlock; k < (b + 1) * kMxBlock; k += 2) {
      codes[k / 2] = uint8_t(e2m1_from_double(v[k] * inv) | (e2m1_from_double(v[k + 1] * inv) << 4));
    }
  }
}

void w2_quantize_row(const double* v, int64_t K, const int* exponents, bool alternate_zeros,
                     uint8_t* codes, uint8_t* scales) {
  // Branch-free on the IEEE bits: big = |v| > 2.5 * 2^exp (an exact threshold, compared as
  // magnitude bits), code = (!negative) << 1 | (big ^ negative).
  const uint64_t alternate = alternate_zeros ? ~uint64_t(0) : 0;
  for (int64_t b = 0; b < K / kMxBlock; ++b) {
    uint8_t scale;
    const double inv = block_inverse_scale(v, exponents, b, &scale);
    scales[b] = scale;
    const uint64_t threshold = std::bit_cast<uint64_t>(2.5 / inv);
    for (int64_t k = b * kMxBlock; k < (b + 1) * kMxBlock; k += 4) {
      uint32_t byte = 0;
      for (int64_t j = 0; j < 4; ++j) {
        const uint64_t bits = std::bit_cast<uint64_t>(v[k + j]);
        const uint64_t magnitude = bits & 0x7fffffffffffffffull;
        const uint64_t zero_alt = (magnitude == 0 ? ~uint64_t(0) : 0) & alternate;
        const uint32_t negative = uint32_t(((bits >> 63) & ~zero_alt) | (uint64_t((k + j) & 1) & zero_alt));
        const uint32_t big = magnitude > threshold;
        byte |= (((negative ^ 1u) << 1) | (big ^ negative)) << (2 * j);
      }
      codes[k / 4] = uint8_t(byte);
    }
  }
}

void w2_opt_quantize_row(const double* v, int64_t K, const int* exponents, bool alternate_zeros,
                         const float* importance, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < K / kMxBlock; ++b) {
    const double* block = v + b * kMxBlock;
    const int e0 = exponents ? exponents[b] : mx_block_exponent(finite_amax(block, kMxBlock));
    double best = INFINITY;
    for (const int delta : {0, -2, -1, 1}) {
      const int e = std::clamp(e0 + delta, -127, 127);
      uint8_t trial_codes[kMxBlock / 4], trial_scale;
      w2_quantize_row(block, kMxBlock, &e, alternate_zeros, trial_codes, &trial_scale);
      float w[kMxBlock];
      w2_dequant_row(trial_codes, &trial_scale, kMxBlock, w);
      double error = 0;
      for (int j = 0; j < kMxBlock; ++j) {
        const double d = block[j] - double(w[j]);
        error += (importance ? double(importance[b * kMxBlock + j]) : 1.0) * d * d;
      }
      if (delta == 0 || error < best) {  // +-Inf makes every error infinite: e0 stays
        best = error;
        scales[b] = trial_scale;
        std::copy(std::begin(trial_codes), std::end(trial_codes), codes + b * (kMxBlock / 4));
      }
    }
  }
}

void mxfp4_dequant_row(const uint8_t* codes, const uint8_t* scales, int64_t K, float* out) {
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t nibble = (codes[k / 2] >> (4 * (k & 1))) & 0xf;
    out[k] = float(std::ldexp(e2m1_to_double(nibble), ue8m0_exponent(scales[k / kMxBlock])));
  }
}

void w2_dequant_row(const uint8_t* codes, const uint8_t* scales, int64_t K, float* out) {
  for (int64_t k = 0; k < K; ++k) {
    const int code = (codes[k / 4] >> (2 * (k & 3))) & 3;
    out[k] = float(std::ldexp(double(kW2Levels[code]), ue8m0_exponent(scales[k / kMxBlock])));
  }
}

}  // namespace moet
