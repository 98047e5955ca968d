// Fast, reproducible filler bytes for invented weights (benchmarks of full-size shapes, tens of GB):
// a 64-bit linear congruential generator (Knuth's MMIX constants) whose state after each step,
// xor-shifted, gives the next 8 bytes. A parallel fill jumps each chunk's generator ahead to its
// place in the walk, so the bytes are those of one sequential walk whatever the thread count, and
// consecutive fills continue the walk.
#pragma once

#include "core/thread_pool.h"

#include <cstddef>
#include <cstdint>

namespace moet {

class RandomBytes {
 public:
  explicit RandomBytes(uint64_t state) : state_(state) {}
  // out[0, n) <- the walk's next ceil(n / 8) steps (the last one's bytes cut to what fits).
  void fill(uint8_t* out, size_t n, ThreadPool& pool);
  uint64_t state() const { return state_; }

  static constexpr uint64_t kMultiplier = 6364136223846793005ull, kIncrement = 1442695040888963407ull;
  static uint64_t bits_of(uint64_t state) { return state ^ (state >> 29); }

 private:
  uint64_t state_;
};

}  // namespace moet
