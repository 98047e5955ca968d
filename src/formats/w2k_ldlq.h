// W2K rounded by BlockLDLQ: rounding that sees the inputs' correlations (QuIP#'s BlockLDLQ; the
// numpy original is tools/quality/ldlq.py with format_study.py's e8p-ldlq). The bytes are W2K's
// (w2k.h) and decode unchanged; only the choice of codewords and scales differs.
//
// For a weight W [N, K] whose input has second moments H = E[x x^T] [K, K], the output error's
// mean square is tr((W - Q) H (W - Q)^T). H is damped (+ 1% of its mean diagonal on the diagonal)
// and decomposed H = U D U^T, U unit upper block-triangular and D block-diagonal with blocks of
// 8 columns (one codeword). Per row, with e = w - q, e H e^T = sum_j f_j D_j f_j^T where
// f_j = e_j + sum_{i<j} e_i U_ij: the blocks are rounded in order, block j's target being
// x_j = w_j + sum_{i<j} e_i U_ij (the feedback of the earlier blocks' errors), whose rounding
// error is exactly f_j. Each block takes the codeword nearest x_j / scale under the weights
// diag(D_j) (w2k_nearest). Each 32 columns' scale is chosen among 13 candidates from the group's
// target before its in-group feedback, amax / 2.75 x f for f = 0.25, 0.35, ..., 1.45 (numpy's
// linspace), each the largest normal UE5M3 value strictly below it (at least 2^-23), by the
// group's exact loss sum_j f_j D_j f_j^T with the earlier groups fixed (the first on a tie); a
// group whose target is all zero takes scale 0. One pass, float64 throughout. +-Inf in a row
// saturates per 32 as in the reference quantizer. Where numpy differs: it never takes scale 0
// (an all-zero target gets 2^-23) and caps candidates at 224 (targets above 240 do not occur in
// weights); its Cholesky and matrix products sum in other orders, which can flip exact ties only.
//
// The decomposition (K^3 / 6 multiply-adds) is made once per matrix H and shared by every row
// and every weight with that input (moet uses one H per MoE layer and input: io/layer_moments.h);
// a row costs K^2 / 2 multiply-adds of feedback plus the codeword searches of 13 candidate
// scales. Rows are independent, so the bytes are the same for any thread count.
#pragma once

#include "core/thread_pool.h"

#include <cstdint>
#include <vector>

namespace moet {

// The block UDU^T decomposition of a damped second-moment matrix.
struct W2kLdlqFactor {
  int64_t K = 0;
  // [K, K] row-major; U[r, c] is defined for r in an earlier block of 8 than c (the feedback).
  std::vector<double> U;
  // [K / 8][8][8]: R_j upper triangular with D_j = R_j R_j^T (the loss is |R_j^T f_j|^2 >= 0).
  std::vector<double> R;
  std::vector<double> weight;  // [K]: diag(D), the codeword search's column weights
};

// The decomposition of H [K, K] (row-major, symmetric; K % 32 == 0) damped by 1% of its mean
// diagonal. Throws when the damped matrix is not positive definite (a zero, indefinite or
// non-finite H). The work is spread over `pool` (the same bits for any thread count).
W2kLdlqFactor w2k_ldlq_factor(const float* H, int64_t K, ThreadPool& pool);

// `rows` rows of K values (the factor's K; row-major [rows, K]): W2K codes [rows, K / 4] and
// scales [rows, K / 32]. Each row is quantized independently; the rows of one call share the
// passes over U (the feedback's memory traffic: K^2 / 2 doubles per call, not per row), so the
// bytes equal those of one row per call.
void w2k_ldlq_quantize_rows(const double* v, int64_t rows, const W2kLdlqFactor& factor, uint8_t* codes,
                            uint8_t* scales);

}  // namespace moet
