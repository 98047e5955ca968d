// RandomBytes (see random_bytes.h): chunks of kChunkSteps steps filled in parallel, each starting
// from the state a sequential walk would have there (one affine map per chunk, applied in order).
#include "core/random_bytes.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace moet {
namespace {

constexpr size_t kChunkSteps = size_t(1) << 13;  // 64 KiB of bytes per chunk

// The affine map state -> a * state + c of `steps` generator steps (by squaring).
struct Jump {
  uint64_t a = 1, c = 0;
};

Jump jump_of(size_t steps) {
  Jump total, power{RandomBytes::kMultiplier, RandomBytes::kIncrement};
  for (; steps > 0; steps >>= 1) {
    if (steps & 1) total = {total.a * power.a, total.c * power.a + power.c};
    power = {power.a * power.a, power.c * power.a + power.c};
  }
  return total;
}

}  // namespace

void RandomBytes::fill(uint8_t* out, size_t n, ThreadPool& pool) {
  const size_t steps = (n + 7) / 8, chunks = (steps + kChunkSteps - 1) / kChunkSteps;
  std::vector<uint64_t> starts(chunks);
  const Jump chunk_jump = jump_of(kChunkSteps);
  uint64_t state = state_;
  for (size_t c = 0; c < chunks; ++c) {
    starts[c] = state;
    state = chunk_jump.a * state + chunk_jump.c;
  }
  pool.parallel_for(chunks, [&](size_t begin, size_t end) {
    for (size_t c = begin; c < end; ++c) {
      uint64_t s = starts[c];
      const size_t first = c * kChunkSteps * 8, last = std::min(n, first + kChunkSteps * 8);
      for (size_t i = first; i < last; i += 8) {
        s = s * kMultiplier + kIncrement;
        const uint64_t bits = bits_of(s);
        std::memcpy(out + i, &bits, std::min<size_t>(8, last - i));
      }
    }
  });
  const Jump rest = jump_of(steps);
  state_ = rest.a * state_ + rest.c;
}

}  // namespace moet
