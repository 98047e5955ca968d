// Multi-threaded requantization (see requant.h). Work is split by rows; each row is a pure
// function of the source, so the partition never changes the output.
#include "formats/requant.h"

#include "core/error.h"
#include "formats/minifloat.h"

#include <atomic>
#include <cmath>

namespace moet {

const char* store_format_name(StoreFormat format) { return format == StoreFormat::w2 ? "w2" : "fp4"; }

StoreFormat store_format_parse(std::string_view name) {
  if (name == "w2") return StoreFormat::w2;
  if (name == "fp4") return StoreFormat::fp4;
  fail("unknown expert format '{}' (expected w2|fp4)", name);
}

int store_format_bits(StoreFormat format) { return format == StoreFormat::w2 ? 2 : 4; }

uint64_t store_codes_bytes(StoreFormat format, int64_t rows, int64_t cols) {
  return uint64_t(rows) * uint64_t(cols) * uint64_t(store_format_bits(format)) / 8;
}

uint64_t store_scales_bytes(int64_t rows, int64_t cols) { return uint64_t(rows) * uint64_t(cols) / 32; }

ZeroCounts source_zero_counts(const SourceView& source, ThreadPool& pool) {
  source_validate(source);
  std::atomic<uint64_t> positive{0}, negative{0};
  pool.parallel_for(size_t(source.rows), [&](size_t begin, size_t end) {
    std::vector<double> row(static_cast<size_t>(source.cols));
    uint64_t pos = 0, neg = 0;
    for (size_t r = begin; r < end; ++r) {
      source_row_f64(source, int64_t(r), row.data());
      for (double v : row) {
        const bool zero = v == 0, negative = std::signbit(v);
        neg += zero & negative;
        pos += zero & !negative;
      }
    }
    positive += pos;
    negative += neg;
  });
  return {positive.load(), negative.load()};
}

ZeroMode zero_mode_resolve(ZeroMode mode, const ZeroCounts& zeros) {
  if (mode != ZeroMode::automatic) return mode;
  const uint64_t total = zeros.positive + zeros.negative;
  const uint64_t minority = std::min(zeros.positive, zeros.negative);
  return (total > 0 && minority * 20 < total) ? ZeroMode::alt : ZeroMode::sign;
}

void source_for_each_row(const SourceView& source, ThreadPool& pool,
                         const std::function<void(const double*, const int*, int64_t)>& row_fn) {
  source_validate(source);
  MOET_CHECK(source.cols % kMxBlock == 0, "tensor {}: K = {} is not a multiple of {}", source.name,
             source.cols, kMxBlock);
  const int64_t K = source.cols;
  std::atomic<int64_t> nan_row{-1};
  pool.parallel_for(size_t(source.rows), [&](size_t begin, size_t end) {
    std::vector<double> values(static_cast<size_t>(K));
    std::vector<int> exponents(static_cast<size_t>(K / kMxBlock));
    for (size_t r = begin; r < end; ++r) {
      source_row_f64(source, int64_t(r), values.data());
      for (double v : values) {
        if (std::isnan(v)) nan_row = int64_t(r);
      }
      const uint8_t* mx = source_row_mx_scales(source, int64_t(r));
      if (mx) {
        for (int64_t b = 0; b < K / kMxBlock; ++b) exponents[size_t(b)] = ue8m0_exponent(mx[b]);
      }
      if (nan_row.load() < 0) row_fn(values.data(), mx ? exponents.data() : nullptr, int64_t(r));
    }
  }, 4);
  MOET_CHECK(nan_row.load() < 0, "tensor {}: NaN in source row {}", source.name, nan_row.load());
}

void quantize_w2_into(const SourceView& source, ZeroMode mode, ThreadPool& pool, uint8_t* codes,
                      uint8_t* scales) {
  if (mode == ZeroMode::automatic) mode = zero_mode_resolve(mode, source_zero_counts(source, pool));
  const bool alternate = mode == ZeroMode::alt;
  const int64_t K = source.cols;
  source_for_each_row(source, pool, [&](const double* v, const int* exps, int64_t r) {
    w2_quantize_row(v, K, exps, alternate, codes + r * (K / 4), scales + r * (K / kMxBlock));
  });
}

void quantize_fp4_into(const SourceView& source, ThreadPool& pool, uint8_t* codes,
                       uint8_t* scales) {
  const int64_t K = source.cols;
  source_for_each_row(source, pool, [&](const double* v, const int* exps, int64_t r) {
    mxfp4_quantize_row(v, K, exps, codes + r * (K / 2), scales + r * (K / kMxBlock));
  });
}

namespace {

BlockTensor block_tensor_alloc(StoreFormat format, const SourceView& source) {
  BlockTensor t;
  t.rows = source.rows;
  t.cols = source.cols;
  t.codes.resize(store_codes_bytes(format, source.rows, source.cols));
  t.scales.resize(store_scales_bytes(source.rows, source.cols));
  return t;
}

}  // namespace

W2Tensor quantize_w2(const SourceView& source, ZeroMode mode, ThreadPool& pool) {
  source_validate(source);
  W2Tensor t = block_tensor_alloc(StoreFormat::w2, source);
  quantize_w2_into(source, mode, pool, t.codes.data(), t.scales.data());
  return t;
}

Fp4Tensor quantize_fp4(const SourceView& source, ThreadPool& pool) {
  source_validate(source);
  Fp4Tensor t = block_tensor_alloc(StoreFormat::fp4, source);
  quantize_fp4_into(source, pool, t.codes.data(), t.scales.data());
  return t;
}

std::vector<float> block_tensor_dequant(StoreFormat format, const BlockTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.rows * t.cols));
  const int64_t row_codes = t.cols * store_format_bits(format) / 8;
  for (int64_t r = 0; r < t.rows; ++r) {
    const uint8_t* codes = t.codes.data() + r * row_codes;
    const uint8_t* scales = t.scales.data() + r * (t.cols / kMxBlock);
    float* dst = out.data() + r * t.cols;
    if (format == StoreFormat::w2) {
      w2_dequant_row(codes, scales, t.cols, dst);
    } else {
      mxfp4_dequant_row(codes, scales, t.cols, dst);
    }
  }
  return out;
}

}  // namespace moet
