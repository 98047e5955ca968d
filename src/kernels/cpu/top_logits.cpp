// Top-k logits per row (see top_logits.h): the rank keys above an estimated threshold, the k
// largest of them moved to the front by nth_element (linear), then sorted (k log k). Keys are
// distinct, so the result does not depend on how the selection moves equal values.
#include "kernels/cpu/top_logits.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

namespace moet {

namespace {

constexpr int64_t kSampleStride = 64;

// A key at or below the k-th largest of values[0, n) with high probability (0 when the sample is
// too small to say): among the m values at every kSampleStride-th index, the one of rank
// 2k m / n + 8, about twice as deep into the sample as the k-th largest lies in the whole.
uint64_t estimated_floor(const float* values, int64_t n, int64_t k, std::vector<uint64_t>& sample) {
  const int64_t m = n / kSampleStride;
  if (m < 64) return 0;
  sample.clear();
  for (int64_t i = 0; i < m * kSampleStride; i += kSampleStride)
    sample.push_back(logit_rank_key(values[i], int32_t(i)));
  const int64_t rank = 2 * k * m / n + 8;
  if (rank >= m) return 0;
  std::nth_element(sample.begin(), sample.begin() + ptrdiff_t(rank), sample.end(), std::greater<uint64_t>());
  return sample[size_t(rank)];
}

}  // namespace

uint64_t append_best_keys(const float* values, int64_t n, int64_t k, uint64_t below, std::vector<uint64_t>& keys) {
  MOET_CHECK(k >= 1, "append_best_keys: k must be at least 1 (got {})", k);
  const size_t start = keys.size();
  // The keys at or above `threshold`. Values are screened by a float comparison with the
  // threshold's value (every such key's value compares >= it) into a byte mask, a loop that
  // vectorises, and only the 8-byte words of the mask that are not zero compute keys.
  const auto gather = [&](uint64_t threshold) {
    keys.resize(start);
    if (threshold == 0) {
      keys.reserve(start + size_t(n));
      for (int64_t i = 0; i < n; ++i) keys.push_back(logit_rank_key(values[i], int32_t(i)));
      return;
    }
    const float bound = logit_of_order_key(uint32_t(threshold >> 32));
    constexpr int64_t kSpan = 4096;
    uint8_t passed[kSpan];
    for (int64_t base = 0; base < n; base += kSpan) {
      const int64_t span = std::min(kSpan, n - base);
      for (int64_t i = 0; i < span; ++i) passed[i] = values[base + i] >= bound ? 1 : 0;
      for (int64_t word = 0; word < span; word += 8) {
        uint64_t bits = 0;
        std::memcpy(&bits, passed + word, size_t(std::min<int64_t>(8, span - word)));
        if (bits == 0) continue;
        for (int64_t i = base + word; i < base + std::min(word + 8, span); ++i) {
          const uint64_t key = logit_rank_key(values[i], int32_t(i));
          if (key >= threshold) keys.push_back(key);
        }
      }
    }
  };
  uint64_t floor = 0;
  if (k < n) {
    std::vector<uint64_t> sample;
    gather(estimated_floor(values, n, k, sample));
    if (keys.size() - start < size_t(k)) gather(0);  // the estimate was too high: every key
    const auto kth = keys.begin() + ptrdiff_t(start) + ptrdiff_t(k - 1);
    std::nth_element(keys.begin() + ptrdiff_t(start), kth, keys.end(), std::greater<uint64_t>());
    floor = *kth;
  } else {
    gather(0);
  }
  keys.erase(std::remove_if(keys.begin() + ptrdiff_t(start), keys.end(),
                            [&](uint64_t key) { return key < floor || key >= below; }),
             keys.end());
  std::sort(keys.begin() + ptrdiff_t(start), keys.end(), std::greater<uint64_t>());
  return floor;
}

void top_logits(const float* logits, int64_t rows, int64_t vocab, int64_t k, float* values, int32_t* ids) {
  MOET_CHECK(k >= 1 && k <= vocab, "top_logits: k must be in [1, vocab = {}] (got {})", vocab, k);
  std::vector<uint64_t> keys;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * vocab;
    keys.clear();
    append_best_keys(row, vocab, k, UINT64_MAX, keys);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = int32_t(~uint32_t(keys[size_t(j)]));
      ids[r * k + j] = id;
      values[r * k + j] = row[id];
    }
  }
}

}  // namespace moet
