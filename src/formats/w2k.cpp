// W2K reference quantizer and dequantizer (see w2k.h). Coordinates are handled as odd integers
// in half units (2c, c a half-integer) so that rounding, parity and the grid lookup are exact.
#include "formats/w2k.h"

#include "formats/mx_block.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace moet {
namespace {

constexpr int kCandidates = 11;  // scale factors f = 0.75 + 0.1 i

// A grid pattern of norm^2 12 (indices 227..255): its coordinate with h = 2 and the two with
// h = 1, or two = -1 for the one with five h = 1.
struct NormTwelve {
  int index = 0, two = -1, one[2] = {0, 0};
};

struct Tables {
  int16_t index[6561];   // base-3 magnitude pattern (h_j in {0, 1, 2}) -> grid index, -1 outside
  uint8_t parity[256];   // sum h_j mod 2: the parity the count of negative signs must have
  NormTwelve norm_twelve[29];
  Tables() {
    std::fill(std::begin(index), std::end(index), int16_t(-1));
    for (int a = 0; a < 256; ++a) {
      int key = 0, sum = 0;
      for (int j = 7; j >= 0; --j) {
        const int h = (kW2kGrid[a] >> (2 * j)) & 3;
        key = key * 3 + h;
        sum += h;
      }
      index[key] = int16_t(a);
      parity[a] = uint8_t(sum & 1);
    }
    for (int a = 227; a < 256; ++a) {
      NormTwelve& p = norm_twelve[a - 227];
      p.index = a;
      int ones = 0;
      for (int j = 0; j < 8; ++j) {
        const int h = (kW2kGrid[a] >> (2 * j)) & 3;
        if (h == 2) p.two = j;
        if (h == 1 && ones < 2) p.one[ones] = j;
        ones += h == 1;
      }
      if (ones != 2) p.two = -1;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

struct Choice {
  uint16_t code = 0;
  double cost = std::numeric_limits<double>::infinity();
};

uint16_t encode(int a, const bool negative[8], int shift) {
  uint16_t code = uint16_t(a | (shift << 15));
  for (int j = 0; j < 7; ++j) code |= uint16_t(negative[j] ? 1 << (8 + j) : 0);
  return code;
}

// A magnitude pattern with natural signs (the sign of z) and at most one coordinate flipped.
struct Candidate {
  double cost = std::numeric_limits<double>::infinity();
  int h[8] = {};
  int flip = -1;  // the coordinate whose sign is the other one (parity fix), -1: none
};

// Per-coordinate costs of z (weights w) with magnitude h + 1/2: natural sign, and the extra cost
// of the other sign (4 w |z| m).
struct CoordinateCosts {
  double keep[8][3], flip[8][3];
  int natural_negatives = 0;
  CoordinateCosts(const double* z, const double* w) {
    for (int j = 0; j < 8; ++j) {
      const double a = std::fabs(z[j]);
      for (int h = 0; h < 3; ++h) {
        keep[j][h] = w[j] * (a - (h + 0.5)) * (a - (h + 0.5));
        flip[j][h] = 4 * w[j] * a * (h + 0.5);
      }
      natural_negatives += z[j] < 0;
    }
  }
  // The pattern's cost: the parity rule wants (negatives + n1) even, else the cheapest flip.
  void evaluate(const int (&h)[8], Candidate* best) const {
    double cost = 0, flip_cost = std::numeric_limits<double>::infinity();
    int ones = 0, flip_at = -1;
    for (int j = 0; j < 8; ++j) {
      cost += keep[j][h[j]];
      ones += h[j] == 1;
      if (flip[j][h[j]] < flip_cost) flip_cost = flip[j][h[j]], flip_at = j;
    }
    const bool odd = ((natural_negatives + ones) & 1) != 0;
    if (odd) cost += flip_cost;
    if (cost < best->cost) {
      best->cost = cost;
      std::copy(std::begin(h), std::end(h), best->h);
      best->flip = odd ? flip_at : -1;
    }
  }
};

// Sorts the indices 0..7 in `order` by key, stably (insertion sort: no allocation).
void sort8(int (&order)[8], const double (&key)[8]) {
  for (int i = 1; i < 8; ++i)
    for (int j = i; j > 0 && key[order[j]] < key[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
}

// The best grid pattern for z. The 227 patterns of norm^2 <= 10 are exactly those with at most
// four h = 1 and no h = 2 (A), or one h = 2 and at most one h = 1 (B); their best members come
// from the coordinates sorted by the cost of h = 1, with the parity fixed by the cheapest flip.
// The 29 of norm^2 12 (grid indices 227..255) are evaluated one by one.
Candidate nearest_pattern(const double* z, const double* w) {
  const CoordinateCosts c(z, w);
  const int n = c.natural_negatives;
  double base = 0, d1[8];
  int order[8], position[8];
  for (int j = 0; j < 8; ++j) base += c.keep[j][0], d1[j] = c.keep[j][1] - c.keep[j][0], order[j] = j;
  sort8(order, d1);
  double prefix[9] = {0};
  for (int i = 0; i < 8; ++i) prefix[i + 1] = prefix[i] + d1[order[i]], position[order[i]] = i;
  Candidate best;
  const auto consider = [&](double cost, auto&& fill) {
    if (cost < best.cost) {
      best.cost = cost;
      std::fill(std::begin(best.h), std::end(best.h), 0);
      best.flip = -1;
      fill();
    }
  };
  // A: the m cheapest coordinates (in sorted order) get h = 1, leaving out `skip` (-1: none).
  const auto ones = [&](int m, int skip) {
    for (int i = 0, taken = 0; taken < m; ++i)
      if (order[i] != skip) best.h[order[i]] = 1, ++taken;
  };
  const auto cheapest = [&](int m, int skip) {  // sum of d1 over those m
    return skip >= 0 && position[skip] < m ? prefix[m + 1] - d1[skip] : prefix[m];
  };
  for (int k = 0; k <= 4; ++k) {
    if (((n + k) & 1) == 0) {
      consider(base + prefix[k], [&] { ones(k, -1); });
      continue;
    }
    for (int j = 0; j < 8; ++j) {
      consider(base + cheapest(k, j) + c.flip[j][0], [&] { ones(k, j), best.flip = j; });
      if (k > 0)
        consider(base + d1[j] + cheapest(k - 1, j) + c.flip[j][1],
                 [&] { ones(k - 1, j), best.h[j] = 1, best.flip = j; });
    }
  }
  // B: h = 2 at i, h = 1 at j (-1: none); the parity flip at i, at j or at the cheapest other.
  int by_flip[8];
  for (int j = 0; j < 8; ++j) by_flip[j] = j;
  double flip0[8];
  for (int j = 0; j < 8; ++j) flip0[j] = c.flip[j][0];
  sort8(by_flip, flip0);
  for (int i = 0; i < 8; ++i) {
    for (int j = -1; j < 8; ++j) {
      if (j == i) continue;
      double cost = base + c.keep[i][2] - c.keep[i][0] + (j >= 0 ? d1[j] : 0);
      int flip = -1;
      if (((n + (j >= 0)) & 1) != 0) {
        int other = 0;
        while (by_flip[other] == i || by_flip[other] == j) ++other;
        flip = by_flip[other];
        double flip_cost = c.flip[flip][0];
        if (c.flip[i][2] < flip_cost) flip_cost = c.flip[i][2], flip = i;
        if (j >= 0 && c.flip[j][1] < flip_cost) flip_cost = c.flip[j][1], flip = j;
        cost += flip_cost;
      }
      consider(cost, [&] {
        best.h[i] = 2;
        if (j >= 0) best.h[j] = 1;
        best.flip = flip;
      });
    }
  }
  // The 29 of norm^2 12: one with five h = 1 (evaluated whole) and 28 with one h = 2 and two
  // h = 1 (their three coordinates from the tables; the parity flip as in B).
  for (const NormTwelve& p : tables().norm_twelve) {
    if (p.two < 0) {
      int h[8];
      for (int j = 0; j < 8; ++j) h[j] = (kW2kGrid[p.index] >> (2 * j)) & 3;
      c.evaluate(h, &best);
      continue;
    }
    double cost = base + c.keep[p.two][2] - c.keep[p.two][0] + d1[p.one[0]] + d1[p.one[1]];
    int flip = -1;
    if ((n & 1) != 0) {
      int other = 0;
      while (by_flip[other] == p.two || by_flip[other] == p.one[0] || by_flip[other] == p.one[1]) ++other;
      flip = by_flip[other];
      double flip_cost = c.flip[flip][0];
      if (c.flip[p.two][2] < flip_cost) flip_cost = c.flip[p.two][2], flip = p.two;
      for (int one : p.one)
        if (c.flip[one][1] < flip_cost) flip_cost = c.flip[one][1], flip = one;
      cost += flip_cost;
    }
    consider(cost, [&] {
      best.h[p.two] = 2, best.h[p.one[0]] = 1, best.h[p.one[1]] = 1;
      best.flip = flip;
    });
  }
  return best;
}

// The nearest codeword of shift `shift` to z = y - t among all grid patterns.
Choice nearest_in_grid(const double* z, const double* w, int shift) {
  const Candidate c = nearest_pattern(z, w);
  int key = 0;
  bool negative[8];
  for (int j = 7; j >= 0; --j) {
    key = key * 3 + c.h[j];
    negative[j] = (z[j] < 0) != (j == c.flip);
  }
  Choice choice;
  choice.cost = c.cost;
  choice.code = encode(tables().index[key], negative, shift);
  return choice;
}

// The best codeword of shift t = (shift ? -1/4 : +1/4) for y (coordinates / scale), weights w.
Choice nearest_for_shift(const double* y, const double* w, int shift) {
  const Tables& tab = tables();
  const double t = shift ? -0.25 : 0.25;
  double z[8];
  int twice[8];  // 2c: odd integers in [-5, 5]
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    z[j] = y[j] - t;
    twice[j] = std::clamp(2 * int(std::max(-8.0, std::min(8.0, std::floor(z[j])))) + 1, -5, 5);
    sum += twice[j];
  }
  if (sum % 4 != 0) {  // odd coordinate sum: the cheapest single step to a neighbouring level
    int best_j = 0, best_to = 0;
    double best_delta = std::numeric_limits<double>::infinity();
    for (int j = 0; j < 8; ++j) {
      const double c = 0.5 * twice[j];
      const bool up = z[j] >= c ? twice[j] < 5 : twice[j] <= -5;
      const int to = twice[j] + (up ? 2 : -2);
      const double delta = w[j] * ((z[j] - 0.5 * to) * (z[j] - 0.5 * to) - (z[j] - c) * (z[j] - c));
      if (delta < best_delta) best_delta = delta, best_j = j, best_to = to;
    }
    twice[best_j] = best_to;
  }
  int key = 0;
  for (int j = 7; j >= 0; --j) key = key * 3 + (std::abs(twice[j]) - 1) / 2;
  Choice choice;
  if (tab.index[key] >= 0) {
    bool negative[8];
    choice.cost = 0;
    for (int j = 0; j < 8; ++j) {
      const double d = z[j] - 0.5 * twice[j];
      choice.cost += w[j] * d * d;
      negative[j] = twice[j] < 0;
    }
    choice.code = encode(tab.index[key], negative, shift);
    return choice;
  }
  return nearest_in_grid(z, w, shift);
}

Choice nearest(const double* y, const double* w) {
  const Choice plus = nearest_for_shift(y, w, 0), minus = nearest_for_shift(y, w, 1);
  return minus.cost < plus.cost ? minus : plus;
}

void quantize_block(const double* v, const double* w, uint8_t* codes, uint8_t* scale) {
  double values[kMxBlock], best = 0;  // scale 0 (every weight zero) stands unless beaten
  const double amax = w2k_saturate_block(v, values);
  for (int j = 0; j < kMxBlock; ++j) best += w[j] * values[j] * values[j];
  *scale = 0;
  std::fill(codes, codes + 8, uint8_t(0));
  if (amax == 0) return;
  uint8_t previous = 0;
  for (int i = 0; i < kCandidates; ++i) {
    uint8_t byte = w2k_scale_floor(amax / kW2kTopMagnitude * (0.75 + 0.1 * i));
    if (byte == 0) byte = 1;
    if (byte == previous) continue;
    previous = byte;
    const double s = w2k_scale_value(byte);
    double cost = 0, y[8];
    uint16_t words[4];
    for (int q = 0; q < 4 && cost < best; ++q) {  // a candidate already no better is dropped early
      for (int j = 0; j < 8; ++j) y[j] = values[8 * q + j] / s;
      const Choice c = nearest(y, w + 8 * q);
      cost += c.cost * s * s;
      words[q] = c.code;
    }
    if (cost < best) {
      best = cost;
      *scale = byte;
      for (int q = 0; q < 4; ++q) codes[2 * q] = uint8_t(words[q]), codes[2 * q + 1] = uint8_t(words[q] >> 8);
    }
  }
}

}  // namespace

double w2k_saturate_block(const double* v, double* out) {
  double amax = finite_amax(v, kMxBlock);
  bool infinite = false;
  for (int j = 0; j < kMxBlock; ++j) infinite |= std::isinf(v[j]);
  if (amax == 0 && infinite) amax = kW2kTopMagnitude * double(w2k_scale_value(255));
  for (int j = 0; j < kMxBlock; ++j) out[j] = std::isinf(v[j]) ? std::copysign(amax, v[j]) : v[j];
  return amax;
}

float w2k_scale_value(uint8_t byte) {
  const int e = byte >> 3, m = byte & 7;
  return e == 0 ? std::ldexp(float(m), -26) : std::ldexp(float(8 + m), e - 27);
}

uint8_t w2k_scale_floor(double target) {
  if (!(target > 0)) return 0;
  if (target >= 240.0) return 255;
  int ex;
  const double fr = std::frexp(target, &ex);  // target = fr 2^ex, fr in [0.5, 1)
  const int e = ex - 1 + 24;
  if (e < 1) return uint8_t(std::min(7.0, std::floor(std::ldexp(target, 26))));
  return uint8_t((e << 3) | int(std::floor((2 * fr - 1) * 8)));
}

uint16_t w2k_nearest(const double* y, const double* w, double* cost) {
  const Choice c = nearest(y, w);
  *cost = c.cost;
  return c.code;
}

void w2k_decode(uint16_t code, int8_t q[8]) {
  const int a = code & 0xff, signs = (code >> 8) & 0x7f;
  const int negative7 = (std::popcount(unsigned(signs)) + tables().parity[a]) & 1;
  const int shift = code & 0x8000 ? -1 : 1;
  for (int j = 0; j < 8; ++j) {
    const int magnitude = 4 * ((kW2kGrid[a] >> (2 * j)) & 3) + 2;
    const bool negative = j < 7 ? (signs >> j) & 1 : negative7;
    q[j] = int8_t((negative ? -magnitude : magnitude) + shift);
  }
}

void w2k_quantize_row(const double* v, const float* importance, int64_t K, uint8_t* codes, uint8_t* scales) {
  double w[kMxBlock];
  for (int64_t b = 0; b < K / kMxBlock; ++b) {
    double total = 0;
    for (int j = 0; j < kMxBlock; ++j) total += w[j] = importance ? double(importance[b * kMxBlock + j]) : 1.0;
    if (!(total > 0)) std::fill(w, w + kMxBlock, 1.0);  // no importance at all: not "anything goes"
    quantize_block(v + b * kMxBlock, w, codes + b * 8, scales + b);
  }
}

void w2k_dequant_row(const uint8_t* codes, const uint8_t* scales, int64_t K, float* out) {
  for (int64_t b = 0; b < K / kMxBlock; ++b) {
    const float quarter = w2k_scale_value(scales[b]) * 0.25f;
    for (int v = 0; v < 4; ++v) {
      int8_t q[8];
      w2k_decode(uint16_t(codes[8 * b + 2 * v] | codes[8 * b + 2 * v + 1] << 8), q);
      for (int j = 0; j < 8; ++j) out[b * kMxBlock + 8 * v + j] = float(q[j]) * quarter;
    }
  }
}

}  // namespace moet
