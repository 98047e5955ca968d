// Top-k logits per row (see top_logits.h): the rank keys of the row, the k largest moved to the
// front by nth_element (linear), then sorted (k log k). Keys are distinct, so the result does not
// depend on how the selection moves equal values.
#include "kernels/cpu/top_logits.h"

#include "core/error.h"

#include <algorithm>
#include <functional>
#include <vector>

namespace moet {

void top_logits(const float* logits, int64_t rows, int64_t vocab, int64_t k, float* values, int32_t* ids) {
  MOET_CHECK(k >= 1 && k <= vocab, "top_logits: k must be in [1, vocab = {}] (got {})", vocab, k);
  std::vector<uint64_t> keys(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) keys[size_t(i)] = logit_rank_key(row[i], int32_t(i));
    const auto kth = keys.begin() + ptrdiff_t(k);
    if (k < vocab) std::nth_element(keys.begin(), kth - 1, keys.end(), std::greater<uint64_t>());
    std::sort(keys.begin(), kth, std::greater<uint64_t>());
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = int32_t(~uint32_t(keys[size_t(j)]));
      ids[r * k + j] = id;
      values[r * k + j] = row[id];
    }
  }
}

}  // namespace moet
