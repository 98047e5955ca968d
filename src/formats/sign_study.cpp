// Sign-bias study and the W2-asym codebook (see sign_study.h). Histograms are integer sums over
// rows, so every statistic is independent of the thread count.
#include "formats/sign_study.h"

#include "formats/minifloat.h"
#include "formats/requant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

namespace moet {
namespace {

// The distinct e2m1 values, ascending.
constexpr double kGrid[15] = {-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Calls fn(row, nibbles[K] unpacked, scales[K/32]) with exact zeros signed per the resolved mode.
void signed_nibble_rows(const SourceView& source, ZeroMode resolved, ThreadPool& pool,
                        const std::function<void(int64_t, const uint8_t*, const uint8_t*)>& fn) {
  const int64_t K = source.cols;
  source_for_each_row(source, pool, [&](const double* v, const int* exps, int64_t r) {
    std::vector<uint8_t> packed(static_cast<size_t>(K / 2)), scales(static_cast<size_t>(K / kMxBlock)), nibbles(static_cast<size_t>(K));
    mxfp4_quantize_row(v, K, exps, packed.data(), scales.data());
    for (int64_t k = 0; k < K; ++k) {
      nibbles[size_t(k)] = (packed[size_t(k / 2)] >> (4 * (k & 1))) & 0xf;
      if (v[k] == 0 && resolved == ZeroMode::alt) nibbles[size_t(k)] = (k & 1) ? 8 : 0;
    }
    fn(r, nibbles.data(), scales.data());
  });
}

}  // namespace

const std::vector<SymmetricSet>& sign_study_sets() {
  static const std::vector<SymmetricSet> sets = [] {
    std::vector<SymmetricSet> out;
    for (int i = 1; i < 8; ++i)
      for (int j = i + 1; j < 8; ++j) out.push_back({kE2M1Values[i], kE2M1Values[j]});
    return out;
  }();
  return sets;
}

int sign_study_w2_set() {
  const auto& sets = sign_study_sets();
  for (size_t i = 0; i < sets.size(); ++i)
    if (sets[i].a == 1.0 && sets[i].b == 4.0) return int(i);
  return -1;
}

E2m1Histogram e2m1_histogram(const SourceView& source, ZeroMode mode, ThreadPool& pool,
                             ZeroMode* resolved) {
  const ZeroMode m = zero_mode_resolve(mode, mode == ZeroMode::automatic ? source_zero_counts(source, pool) : ZeroCounts{});
  if (resolved) *resolved = m;
  E2m1Histogram total{};
  std::mutex mutex;
  signed_nibble_rows(source, m, pool, [&](int64_t, const uint8_t* nibbles, const uint8_t*) {
    E2m1Histogram local{};
    for (int64_t k = 0; k < source.cols; ++k) ++local[nibbles[k]];
    std::lock_guard<std::mutex> lock(mutex);
    for (int i = 0; i < 16; ++i) total[size_t(i)] += local[size_t(i)];
  });
  return total;
}

AsymCodebook asym_codebook_fit(const E2m1Histogram& h) {
  // Distinct values ascending (+-0 merged), with their weights.
  struct Point { double value; double weight; std::vector<int> nibbles; };
  std::vector<Point> points;
  for (int mag = 7; mag >= 1; --mag) points.push_back({-kE2M1Values[mag], double(h[size_t(8 + mag)]), {8 + mag}});
  points.push_back({0.0, double(h[0] + h[8]), {0, 8}});
  for (int mag = 1; mag <= 7; ++mag) points.push_back({kE2M1Values[mag], double(h[size_t(mag)]), {mag}});
  std::erase_if(points, [](const Point& p) { return p.weight == 0; });
  AsymCodebook book;
  const int n = int(points.size());
  if (n == 0) {
    book.levels = {-4, -1, 1, 4};
    return book;
  }
  // cost(i, j): weighted SSE of points [i, j) around their mean, via prefix sums.
  std::vector<double> w(size_t(n) + 1, 0), s(size_t(n) + 1, 0), q(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const Point& p = points[size_t(i)];
    w[size_t(i) + 1] = w[size_t(i)] + p.weight;
    s[size_t(i) + 1] = s[size_t(i)] + p.weight * p.value;
    q[size_t(i) + 1] = q[size_t(i)] + p.weight * p.value * p.value;
  }
  // cost(i, j): weighted SSE of points [i, j) around the best e2m1 grid level (lowest on a tie).
  // Weights are counts and values multiples of 1/2, so every sum here is exact in float64.
  auto best_level = [&](int i, int j, double* level) {
    const double ww = w[size_t(j)] - w[size_t(i)], ss = s[size_t(j)] - s[size_t(i)], qq = q[size_t(j)] - q[size_t(i)];
    double best = std::numeric_limits<double>::infinity();
    for (double value : kGrid) {
      const double c = qq - 2 * value * ss + value * value * ww;
      if (c < best) {
        best = c;
        *level = value;
      }
    }
    return best;
  };
  auto cost = [&](int i, int j) {
    double level = 0;
    return best_level(i, j, &level);
  };
  const int clusters = std::min(4, n);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[c][j]: min cost of the first j points in c clusters; split[c][j]: start of the last one.
  std::vector<std::vector<double>> best(size_t(clusters) + 1, std::vector<double>(size_t(n) + 1, kInf));
  std::vector<std::vector<int>> split(size_t(clusters) + 1, std::vector<int>(size_t(n) + 1, 0));
  best[0][0] = 0;
  for (int c = 1; c <= clusters; ++c) {
    for (int j = c; j <= n; ++j) {
      for (int i = c - 1; i < j; ++i) {
        const double candidate = best[size_t(c) - 1][size_t(i)] + cost(i, j);
        if (candidate < best[size_t(c)][size_t(j)]) {
          best[size_t(c)][size_t(j)] = candidate;
          split[size_t(c)][size_t(j)] = i;
        }
      }
    }
  }
  // Walk back; with fewer than 4 distinct values the unused top codes repeat the last level.
  int j = n;
  for (int c = clusters; c >= 1; --c) {
    const int i = split[size_t(c)][size_t(j)];
    double level = 0;
    best_level(i, j, &level);
    book.levels[size_t(c) - 1] = level;
    for (int p = i; p < j; ++p)
      for (int nib : points[size_t(p)].nibbles) book.code_of_nibble[size_t(nib)] = uint8_t(c - 1);
    j = i;
  }
  for (int c = clusters; c < 4; ++c) book.levels[size_t(c)] = book.levels[size_t(clusters) - 1];
  return book;
}

SignStats sign_stats(const E2m1Histogram& h, const std::array<double, 16>& level_of_nibble) {
  double count = 0, bias = 0, err2 = 0, value2 = 0;
  for (int i = 0; i < 16; ++i) {
    const double hi = double(h[size_t(i)]), value = e2m1_to_double(uint8_t(i));
    const double d = level_of_nibble[size_t(i)] - value;
    count += hi;
    bias += hi * d;
    err2 += hi * d * d;
    value2 += hi * value * value;
  }
  SignStats st;
  st.bias = count > 0 ? bias / count : 0;
  st.rel_rms = value2 > 0 ? std::sqrt(err2 / value2) : 0;
  return st;
}

std::array<double, 16> w2_sym_levels() {
  std::array<double, 16> levels{};
  for (int i = 0; i < 16; ++i) levels[size_t(i)] = ((i & 8) ? -1 : 1) * ((i & 7) >= 5 ? 4.0 : 1.0);
  return levels;
}

TensorStudy sign_study(const SourceView& source, ZeroMode mode, ThreadPool& pool) {
  TensorStudy t;
  t.histogram = e2m1_histogram(source, mode, pool, &t.zero_mode);
  t.sym = sign_stats(t.histogram, w2_sym_levels());
  t.asym_codebook = asym_codebook_fit(t.histogram);
  std::array<double, 16> asym_levels{};
  for (int i = 0; i < 16; ++i) asym_levels[size_t(i)] = t.asym_codebook.levels[t.asym_codebook.code_of_nibble[size_t(i)]];
  t.asym = sign_stats(t.histogram, asym_levels);
  double best = std::numeric_limits<double>::infinity();
  const auto& sets = sign_study_sets();
  for (size_t s = 0; s < sets.size(); ++s) {
    std::array<double, 16> levels{};
    for (int i = 0; i < 16; ++i) {
      const double mag = kE2M1Values[i & 7];
      const double level = std::fabs(mag - sets[s].a) <= std::fabs(mag - sets[s].b) ? sets[s].a : sets[s].b;
      levels[size_t(i)] = (i & 8) ? -level : level;
    }
    const SignStats st = sign_stats(t.histogram, levels);
    double sse = st.rel_rms;  // same denominator for every set: comparing rel_rms compares SSE
    if (sse < best) {
      best = sse;
      t.best_set = int(s);
    }
  }
  return t;
}

void w2_asym_quantize(const SourceView& source, ZeroMode mode, ThreadPool& pool,
                      std::vector<uint8_t>* codes, std::vector<uint8_t>* scales, AsymCodebook* book) {
  ZeroMode resolved;
  *book = asym_codebook_fit(e2m1_histogram(source, mode, pool, &resolved));
  const int64_t K = source.cols;
  codes->assign(size_t(source.rows * K / 4), 0);
  scales->assign(size_t(source.rows * K / kMxBlock), 0);
  signed_nibble_rows(source, resolved, pool, [&](int64_t r, const uint8_t* nibbles, const uint8_t* s) {
    std::copy(s, s + K / kMxBlock, scales->data() + r * (K / kMxBlock));
    uint8_t* out = codes->data() + r * (K / 4);
    for (int64_t k = 0; k < K; ++k) out[k / 4] |= uint8_t(book->code_of_nibble[nibbles[k]] << (2 * (k & 3)));
  });
}

std::vector<float> w2_asym_dequant(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                   const AsymCodebook& book, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int code = (codes[size_t(i / 4)] >> (2 * (i & 3))) & 3;
    out[size_t(i)] = float(std::ldexp(book.levels[size_t(code)], ue8m0_exponent(scales[size_t(i / kMxBlock)])));
  }
  return out;
}

}  // namespace moet
