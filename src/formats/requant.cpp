// Multi-threaded requantization (see requant.h). Work is split by rows; each row is a pure
// function of the source, so the partition never changes the output.
#include "formats/requant.h"

#include "core/error.h"
#include "formats/minifloat.h"

#include <algorithm>
#include <atomic>
#include <cmath>

namespace moet {

const char* store_format_name(StoreFormat format) {
  switch (format) {
    case StoreFormat::w2: return "w2";
    case StoreFormat::fp4: return "fp4";
    case StoreFormat::w2k: return "w2k";
  }
  return "?";
}

StoreFormat store_format_parse(std::string_view name) {
  if (name == "w2") return StoreFormat::w2;
  if (name == "fp4") return StoreFormat::fp4;
  if (name == "w2k") return StoreFormat::w2k;
  fail("unknown expert format '{}' (expected w2|w2k|fp4)", name);
}

int store_format_bits(StoreFormat format) { return format == StoreFormat::fp4 ? 4 : 2; }

W2Quantizer w2_quantizer_parse(std::string_view name) {
  if (name == "reference") return W2Quantizer::reference;
  if (name == "opt") return W2Quantizer::opt;
  fail("unknown W2 quantizer '{}' (expected reference|opt)", name);
}

const char* w2_quantizer_name(W2Quantizer quantizer) { return quantizer == W2Quantizer::opt ? "opt" : "reference"; }

W2kQuantizer w2k_quantizer_parse(std::string_view name) {
  if (name == "reference") return W2kQuantizer::reference;
  if (name == "ldlq") return W2kQuantizer::ldlq;
  fail("unknown W2K quantizer '{}' (expected reference|ldlq)", name);
}

const char* w2k_quantizer_name(W2kQuantizer quantizer) {
  return quantizer == W2kQuantizer::ldlq ? "ldlq" : "reference";
}

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

namespace {

// Rows per call of W2K's LDLQ quantizer: they share its passes over the decomposition.
constexpr int64_t kLdlqTileRows = 16;

// Calls tile_fn(values, exponents, first, n) for consecutive tiles of up to `tile` rows, decoded
// exactly to float64 ([n, cols]); exponents [n, cols / 32] are the verbatim block exponents of an
// MXFP4 source, else nullptr. Tiles run in parallel; throws naming the tensor when the source
// holds NaN (no tile is handed out once one was seen).
void source_for_each_tile(const SourceView& source, ThreadPool& pool, int64_t tile,
                          const std::function<void(const double*, const int*, int64_t, int64_t)>& tile_fn) {
  source_validate(source);
  MOET_CHECK(source.cols % kMxBlock == 0, "tensor {}: K = {} is not a multiple of {}", source.name,
             source.cols, kMxBlock);
  const int64_t K = source.cols, tiles = (source.rows + tile - 1) / tile;
  std::atomic<int64_t> nan_row{-1};
  pool.parallel_for(size_t(tiles), [&](size_t begin, size_t end) {
    std::vector<double> values(static_cast<size_t>(tile * K));
    std::vector<int> exponents(static_cast<size_t>(tile * K / kMxBlock));
    for (size_t t = begin; t < end; ++t) {
      const int64_t first = int64_t(t) * tile, n = std::min(tile, source.rows - first);
      bool mx = false;
      for (int64_t i = 0; i < n; ++i) {
        double* row = values.data() + i * K;
        source_row_f64(source, first + i, row);
        for (int64_t k = 0; k < K; ++k) {
          if (std::isnan(row[k])) nan_row = first + i;
        }
        const uint8_t* scales = source_row_mx_scales(source, first + i);
        mx = scales != nullptr;
        for (int64_t b = 0; mx && b < K / kMxBlock; ++b) exponents[size_t(i * K / kMxBlock + b)] = ue8m0_exponent(scales[b]);
      }
      if (nan_row.load() < 0) tile_fn(values.data(), mx ? exponents.data() : nullptr, first, n);
    }
  }, size_t(std::max<int64_t>(1, 4 / tile)));
  MOET_CHECK(nan_row.load() < 0, "tensor {}: NaN in source row {}", source.name, nan_row.load());
}

}  // namespace

void source_for_each_row(const SourceView& source, ThreadPool& pool,
                         const std::function<void(const double*, const int*, int64_t)>& row_fn) {
  source_for_each_tile(source, pool, 1,
                       [&](const double* v, const int* exponents, int64_t r, int64_t) { row_fn(v, exponents, r); });
}

void quantize_w2_into(const SourceView& source, ZeroMode mode, ThreadPool& pool, uint8_t* codes,
                      uint8_t* scales) {
  quantize_into(StoreFormat::w2, source, {mode, W2Quantizer::reference, nullptr}, pool, codes, scales);
}

void quantize_into(StoreFormat format, const SourceView& source, const QuantizeOptions& options, ThreadPool& pool,
                   uint8_t* codes, uint8_t* scales) {
  const int64_t K = source.cols;
  if (format == StoreFormat::fp4) return quantize_fp4_into(source, pool, codes, scales);
  if (format == StoreFormat::w2k && options.ldlq != nullptr) {
    MOET_CHECK(options.ldlq->K == K, "tensor {}: {} input columns, its second moments are {} x {}", source.name, K,
               options.ldlq->K, options.ldlq->K);
    return source_for_each_tile(source, pool, kLdlqTileRows, [&](const double* v, const int*, int64_t first, int64_t n) {
      w2k_ldlq_quantize_rows(v, n, *options.ldlq, codes + first * (K / 4), scales + first * (K / kMxBlock));
    });
  }
  if (format == StoreFormat::w2k) {
    return source_for_each_row(source, pool, [&](const double* v, const int*, int64_t r) {
      w2k_quantize_row(v, options.importance, K, codes + r * (K / 4), scales + r * (K / kMxBlock));
    });
  }
  ZeroMode mode = options.zero_mode;
  if (mode == ZeroMode::automatic) mode = zero_mode_resolve(mode, source_zero_counts(source, pool));
  const bool alternate = mode == ZeroMode::alt;
  const bool opt = options.w2_quantizer == W2Quantizer::opt;
  source_for_each_row(source, pool, [&](const double* v, const int* exps, int64_t r) {
    uint8_t* c = codes + r * (K / 4);
    uint8_t* s = scales + r * (K / kMxBlock);
    if (opt) {
      w2_opt_quantize_row(v, K, exps, alternate, options.importance, c, s);
    } else {
      w2_quantize_row(v, K, exps, alternate, c, s);
    }
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

BlockTensor quantize(StoreFormat format, const SourceView& source, const QuantizeOptions& options, ThreadPool& pool) {
  source_validate(source);
  BlockTensor t = block_tensor_alloc(format, source);
  quantize_into(format, source, options, pool, t.codes.data(), t.scales.data());
  return t;
}

W2Tensor quantize_w2(const SourceView& source, ZeroMode mode, ThreadPool& pool) {
  return quantize(StoreFormat::w2, source, {mode, W2Quantizer::reference, nullptr}, pool);
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
    switch (format) {
      case StoreFormat::w2: w2_dequant_row(codes, scales, t.cols, dst); break;
      case StoreFormat::w2k: w2k_dequant_row(codes, scales, t.cols, dst); break;
      case StoreFormat::fp4: mxfp4_dequant_row(codes, scales, t.cols, dst); break;
    }
  }
  return out;
}

}  // namespace moet
