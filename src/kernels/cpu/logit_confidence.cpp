// logit_confidence() (see logit_confidence.h).
#include "kernels/cpu/logit_confidence.h"

#include "kernels/cpu/softmax_weights.h"

#include <cmath>
#include <limits>

namespace moet {

void logit_confidence(const float* logits, int64_t rows, int64_t vocab, float* out) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    float first = kNone, second = kNone;
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = row[i];
      if (v > first) {  // NaN compares false
        second = first;
        first = v;
      } else if (v > second) {  // a second copy of the largest value lands here too
        second = v;
      }
    }
    if (first == kNone) {  // no number above -inf: no probability to speak of
      out[2 * r] = out[2 * r + 1] = 0.0f;
      continue;
    }
    // Terms at the largest value are exactly 1 (also when it is +inf, where l - l1 is NaN).
    const auto term = [&](float v) { return v == first ? 1.0 : double(exp_nonpositive(v - first)); };
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i)
      if (row[i] == row[i]) sum += term(row[i]);
    const double p1 = 1.0 / sum, p2 = term(second) / sum;
    out[2 * r] = float(p1);
    out[2 * r + 1] = float(p1 - p2);
  }
}

}  // namespace moet
