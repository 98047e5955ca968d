// How sure a row of logits is, in the two signals of the confidence gate (engine/confidence_gate.h):
// the largest softmax probability p1 = e^(l1 - logsumexp) and the margin p1 - p2 between the two
// largest probabilities. Both lie in [0, 1], so one threshold tau serves either. A decode step
// may return only its rows' best logits (the top-logits width), which lack the softmax
// denominator: the forward computes these where the whole rows are. NaN logits have no
// probability; a row without a number gives {0, 0}. The sum of e^(l - l1) is taken in double in
// index order, each term by exp_nonpositive() (kernels/cpu/softmax_weights.h), so the result
// depends only on the row.
#pragma once

#include <cstdint>

namespace moet {

// out[2 r] = p1 and out[2 r + 1] = p1 - p2 of row r of logits [rows, vocab].
void logit_confidence(const float* logits, int64_t rows, int64_t vocab, float* out);

}  // namespace moet
