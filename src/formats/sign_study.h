// The sign-bias study (ARCHITECTURE.md 1.1, seed notes): everything here works in unit
// (pre-scale) space on the 16-bin histogram of a tensor's e2m1 values after the MXFP4 step of the
// reference pipeline, with exact zeros signed as the W2 zero mode would sign them.
//   bias    = sum h * (level - value) / sum h
//   rel_rms = sqrt(sum h * (level - value)^2 / sum h * value^2)
// W2 symmetric maps value -> sign * (|value| <= 2 ? 1 : 4); W2-asym is the L2-optimal codebook of
// 4 levels from the e2m1 grid (the seed's {-3,-1,0.5,4} kind) over the histogram, found by exact
// 1-D dynamic programming: contiguous clusters of the sorted values, each at its best grid level
// (lowest on a tie), the leftmost split on a tie. All sums are exact, so results are reproducible. The symmetric sets are
// the 21 pairs a < b of nonzero e2m1 magnitudes; each value goes to the nearer of a, b (a on a tie).
#pragma once

#include "core/thread_pool.h"
#include "formats/mx_block.h"
#include "formats/source.h"

#include <array>
#include <cstdint>
#include <vector>

namespace moet {

// Bin i counts e2m1 nibble i (bit 3 = sign): 0..7 = +0..+6, 8..15 = -0..-6.
using E2m1Histogram = std::array<uint64_t, 16>;

// The asymmetric codebook: levels ascending, and the cluster (code) of each nibble.
struct AsymCodebook {
  std::array<double, 4> levels{};
  std::array<uint8_t, 16> code_of_nibble{};
};

struct SignStats {
  double bias = 0;
  double rel_rms = 0;
};

struct TensorStudy {
  E2m1Histogram histogram{};
  ZeroMode zero_mode = ZeroMode::sign;  // resolved
  SignStats sym, asym;
  AsymCodebook asym_codebook;
  int best_set = 0;  // index into sign_study_sets()
};

struct SymmetricSet {
  double a, b;
};
const std::vector<SymmetricSet>& sign_study_sets();
int sign_study_w2_set();  // the index of {1, 4}

// Histogram of the tensor's e2m1 values; exact zeros follow `mode` (auto resolved per tensor).
E2m1Histogram e2m1_histogram(const SourceView& source, ZeroMode mode, ThreadPool& pool,
                             ZeroMode* resolved = nullptr);
AsymCodebook asym_codebook_fit(const E2m1Histogram& h);
SignStats sign_stats(const E2m1Histogram& h, const std::array<double, 16>& level_of_nibble);
std::array<double, 16> w2_sym_levels();
TensorStudy sign_study(const SourceView& source, ZeroMode mode, ThreadPool& pool);

// W2-asym tensor: 2-bit cluster codes laid out like W2, MXFP4 block scales, per-tensor levels.
void w2_asym_quantize(const SourceView& source, ZeroMode mode, ThreadPool& pool,
                      std::vector<uint8_t>* codes, std::vector<uint8_t>* scales, AsymCodebook* book);
std::vector<float> w2_asym_dequant(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                   const AsymCodebook& book, int64_t rows, int64_t cols);

}  // namespace moet
