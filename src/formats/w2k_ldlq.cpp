// BlockLDLQ for W2K (see w2k_ldlq.h): the decomposition of the damped second moments and the row
// quantizer. The decomposition is a Cholesky factorisation from the last column back, H = V V^T
// with V upper triangular (numpy's Cholesky of the reversed matrix), then per block of 8 columns
// U = V_block V_jj^-1 and R_j = V_jj.
#include "formats/w2k_ldlq.h"

#include "core/error.h"
#include "formats/mx_block.h"
#include "formats/w2k.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moet {
namespace {

constexpr int kCodeword = 8;          // columns per codeword (a block of D)
constexpr int kScaleCandidates = 13;  // f = 0.25, 0.35, ..., 1.45 (format_study.py's e8p_scales)
// The order the candidates are tried in: from where the best usually is (f = 1.15 .. 1.25 on
// models/tiny) outwards, so that the others are dropped after few blocks. Ties still go to the
// lowest index, so the order never changes the result.
constexpr int kTryOrder[kScaleCandidates] = {9, 10, 8, 11, 7, 12, 6, 5, 4, 3, 2, 1, 0};
constexpr double kDamping = 0.01;       // of the mean diagonal (ldlq.py's damp)
constexpr uint8_t kSmallestNormal = 8;  // UE5M3 2^-23: the least scale numpy's grid has

// The candidate factor f_i exactly as numpy's linspace(0.25, 1.45, 13) computes it.
double scale_factor(int i) {
  return i == kScaleCandidates - 1 ? 1.45 : double(i) * ((1.45 - 0.25) / (kScaleCandidates - 1)) + 0.25;
}

// The largest normal UE5M3 byte whose value is strictly below target (at least 2^-23).
uint8_t scale_below(double target) {
  uint8_t byte = w2k_scale_floor(target);
  if (byte > 0 && double(w2k_scale_value(byte)) >= target) --byte;
  return std::max(byte, kSmallestNormal);
}

// H in float64 (row-major), damped.
std::vector<double> damped(const float* H, int64_t K) {
  std::vector<double> A(H, H + K * K);
  double trace = 0;
  for (int64_t k = 0; k < K; ++k) trace += A[size_t(k * K + k)];
  const double damping = kDamping * trace / double(K);
  for (int64_t k = 0; k < K; ++k) A[size_t(k * K + k)] += damping;
  return A;
}

// In place: the upper triangle of A becomes V (A = V V^T, V upper triangular), from the last
// column back. Column i's entries above the diagonal are independent dot products (rows in
// parallel, each summed in column order: the same bits for any thread count).
void reverse_cholesky(std::vector<double>& A, int64_t K, ThreadPool& pool) {
  for (int64_t i = K - 1; i >= 0; --i) {
    const double* vi = A.data() + i * K;
    double d = vi[i];
    for (int64_t k = i + 1; k < K; ++k) d -= vi[k] * vi[k];
    MOET_CHECK(d > 0 && std::isfinite(d), "LDLQ: the damped second moments are not positive definite (column {})",
               i);
    const double root = std::sqrt(d);
    A[size_t(i * K + i)] = root;
    const size_t grain = size_t(std::max<int64_t>(1, 65536 / std::max<int64_t>(1, K - i)));
    pool.parallel_for(size_t(i), [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        double* vr = A.data() + int64_t(r) * K;
        double s = vr[i];
        for (int64_t k = i + 1; k < K; ++k) s -= vr[k] * vi[k];
        vr[i] = s / root;
      }
    }, grain);
  }
}

}  // namespace

W2kLdlqFactor w2k_ldlq_factor(const float* H, int64_t K, ThreadPool& pool) {
  MOET_CHECK(K > 0 && K % kMxBlock == 0, "LDLQ: K = {} is not a positive multiple of {}", K, kMxBlock);
  W2kLdlqFactor f;
  f.K = K;
  f.U = damped(H, K);
  reverse_cholesky(f.U, K, pool);
  f.R.assign(size_t(K * kCodeword), 0.0);
  f.weight.assign(size_t(K), 0.0);
  for (int64_t b = 0; b < K; b += kCodeword) {
    double* R = f.R.data() + b * kCodeword;  // R_j = V_jj (upper triangular)
    for (int m = 0; m < kCodeword; ++m)
      for (int l = m; l < kCodeword; ++l) R[m * kCodeword + l] = f.U[size_t((b + m) * K + b + l)];
    for (int m = 0; m < kCodeword; ++m)
      for (int l = m; l < kCodeword; ++l) f.weight[size_t(b + m)] += R[m * kCodeword + l] * R[m * kCodeword + l];
    // U[r, block] = V[r, block] V_jj^-1 for the rows of earlier blocks: solve u V_jj = v.
    pool.parallel_for(size_t(b), [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) {
        double* u = f.U.data() + int64_t(r) * K + b;
        for (int m = 0; m < kCodeword; ++m) {
          double s = u[m];
          for (int l = 0; l < m; ++l) s -= u[l] * R[l * kCodeword + m];
          u[m] = s / R[m * kCodeword + m];
        }
      }
    }, 256);
  }
  return f;
}

namespace {

// Group c's codewords and scale among the candidates (see w2k_ldlq.h): target is the group's
// weights plus the earlier groups' feedback; error receives the chosen w - q of its 32 columns.
void quantize_group(const double* w, const double* target, const W2kLdlqFactor& f, int64_t c, uint8_t* codes,
                    uint8_t* scale, double* error) {
  const int64_t K = f.K;
  double amax = 0;
  for (int j = 0; j < kMxBlock; ++j) amax = std::max(amax, std::fabs(target[j]));
  if (amax == 0) {  // an all-zero target: scale 0, every weight zero
    *scale = 0;
    std::fill(codes, codes + 8, uint8_t(0));
    std::copy(w, w + kMxBlock, error);
    return;
  }
  uint8_t bytes[kScaleCandidates];
  for (int i = 0; i < kScaleCandidates; ++i) bytes[i] = scale_below(amax / kW2kTopMagnitude * scale_factor(i));
  double best_loss = std::numeric_limits<double>::infinity();
  int best = kScaleCandidates;
  // i beats the best so far with a loss this low (less, or equal and an earlier candidate).
  const auto beats = [&](double loss, int i) { return loss < best_loss || (loss == best_loss && i < best); };
  for (const int i : kTryOrder) {
    if (i > 0 && bytes[i] == bytes[i - 1]) continue;  // the same scale as an earlier candidate
    const uint8_t byte = bytes[i];
    const double s = w2k_scale_value(byte);
    double loss = 0, e[kMxBlock];
    uint8_t words[8];
    for (int q = 0; q < 4 && beats(loss, i); ++q) {  // the loss only grows: a beaten candidate is dropped early
      const int64_t col = c + q * kCodeword;
      double x[kCodeword], y[kCodeword];
      for (int m = 0; m < kCodeword; ++m) {  // the target plus the feedback of this group's earlier blocks
        double fed = 0;
        for (int r = 0; r < q * kCodeword; ++r) fed += e[r] * f.U[size_t((c + r) * K + col + m)];
        x[m] = target[q * kCodeword + m] + fed;
        y[m] = x[m] / s;
      }
      double cost;
      const uint16_t code = w2k_nearest(y, f.weight.data() + col, &cost);
      words[2 * q] = uint8_t(code), words[2 * q + 1] = uint8_t(code >> 8);
      int8_t levels[kCodeword];
      w2k_decode(code, levels);
      double rounding[kCodeword];  // f_j = x_j - q_j
      for (int m = 0; m < kCodeword; ++m) {
        const double value = double(levels[m]) * s * 0.25;
        rounding[m] = x[m] - value;
        e[q * kCodeword + m] = w[q * kCodeword + m] - value;
      }
      const double* R = f.R.data() + col * kCodeword;
      for (int l = 0; l < kCodeword; ++l) {  // f_j D_j f_j^T = |R_j^T f_j|^2
        double g = 0;
        for (int m = 0; m <= l; ++m) g += R[m * kCodeword + l] * rounding[m];
        loss += g * g;
      }
    }
    if (beats(loss, i)) {
      best_loss = loss;
      best = i;
      *scale = byte;
      std::copy(words, words + 8, codes);
      std::copy(e, e + kMxBlock, error);
    }
  }
}

}  // namespace

void w2k_ldlq_quantize_rows(const double* v, int64_t rows, const W2kLdlqFactor& f, uint8_t* codes,
                            uint8_t* scales) {
  const int64_t K = f.K;
  // Per row: its weights (+-Inf saturated) and the feedback, sum of the decided e_r U[r, c].
  std::vector<double> w(static_cast<size_t>(rows * K)), feedback(static_cast<size_t>(rows * K), 0.0);
  for (int64_t b = 0; b < rows * K; b += kMxBlock) w2k_saturate_block(v + b, w.data() + b);
  std::vector<double> errors(static_cast<size_t>(rows * kMxBlock));
  for (int64_t c = 0; c < K; c += kMxBlock) {
    for (int64_t r = 0; r < rows; ++r) {
      const double* wr = w.data() + r * K + c;
      double target[kMxBlock];
      for (int j = 0; j < kMxBlock; ++j) target[j] = wr[j] + feedback[size_t(r * K + c + j)];
      quantize_group(wr, target, f, c, codes + r * (K / 4) + c / 4, scales + r * (K / kMxBlock) + c / kMxBlock,
                     errors.data() + r * kMxBlock);
    }
    // The group's errors fed into every later column, eight columns at a time: the 32 x 8 block of U
    // stays in cache for every row, and each column sums its 32 terms in order (the same bits as
    // adding them one row of U at a time).
    for (int64_t col = c + kMxBlock; col < K; col += kCodeword) {
      for (int64_t r = 0; r < rows; ++r) {
        const double* e = errors.data() + r * kMxBlock;
        double* fr = feedback.data() + r * K + col;
        double sum[kCodeword];
        std::copy(fr, fr + kCodeword, sum);
        for (int j = 0; j < kMxBlock; ++j) {
          const double* u = f.U.data() + (c + j) * K + col;
          for (int m = 0; m < kCodeword; ++m) sum[m] += e[j] * u[m];
        }
        std::copy(sum, sum + kCodeword, fr);
      }
    }
  }
}

}  // namespace moet
