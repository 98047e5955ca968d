// WeightLoader implementation (see weight_loader.h).
#include "models/weight_loader.h"

#include "core/error.h"
#include "core/log.h"
#include "formats/checkpoint_formats.h"
#include "formats/minifloat.h"
#include "io/pack_source.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace moet {
namespace {

// The scale of every invented FP8 block: invented values (N(0, 0.02)) become codes of about
// N(0, 64), well inside e4m3's +-448.
constexpr float kInventedFp8Scale = 0.02f / 64.0f;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_shape(const HostTensor& found, const std::vector<int64_t>& shape) {
  MOET_CHECK(found.shape == shape, "tensor '{}' in {} has shape {} but the config implies [{}]", found.name,
             found.file, found.shape_text(), fmt::join(shape, ", "));
}

// The block scales X.weight_scale_inv of FP8 tensor X.weight [rows, cols], checked: F32 or BF16
// [ceil(rows / block_rows), ceil(cols / block_cols)].
const HostTensor& fp8_scales(const Checkpoint& checkpoint, const std::string& name, int64_t rows, int64_t cols,
                             int64_t block_rows, int64_t block_cols) {
  const std::string scale_name = name + "_scale_inv";
  const HostTensor* scales = checkpoint.find(scale_name);
  MOET_CHECK(scales != nullptr, "{}: FP8 tensor '{}' has no block scales '{}'", checkpoint.dir().string(), name,
             scale_name);
  const std::vector<int64_t> shape = {(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols};
  MOET_CHECK((scales->dtype == DType::f32 || scales->dtype == DType::bf16) && scales->shape == shape,
             "tensor '{}' in {} is {} {} but the block scales of FP8 tensor '{}' [{}, {}] must be F32 or BF16 [{}]",
             scale_name, scales->file, dtype_name(scales->dtype), scales->shape_text(), name, rows, cols,
             fmt::join(shape, ", "));
  return *scales;
}

// Whether the checkpoint's FP8 blocks are 128 x 128 (quantization_config.weight_block_size; the
// default when absent, as checkpoint_source_view assumes).
bool fp8_blocks_of_128(const Checkpoint& checkpoint) {
  const auto& q = checkpoint.config().value("quantization_config", nlohmann::json::object());
  return !q.contains("weight_block_size") ||
         q["weight_block_size"] == nlohmann::json::array({kFp8Block, kFp8Block});
}

// The same tensor as a U8 byte plane (FP8 codes travel to the backend byte for byte).
HostTensor as_bytes(HostTensor info) {
  info.dtype = DType::u8;
  return info;
}

// A WeightPart resolved against a full shape [n] or [n, ...]: rows [r0, r1) of n, columns [c0, c1)
// of the rest (cols of them).
struct PartRange {
  int64_t r0, r1, c0, c1, cols;
  bool all_columns() const { return c0 == 0 && c1 == cols; }
};

PartRange resolve(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part) {
  MOET_CHECK(!shape.empty(), "tensor '{}': a part of a scalar", name);
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  const PartRange p{part.row_begin, part.row_end < 0 ? shape[0] : part.row_end, part.col_begin,
                    part.col_end < 0 ? cols : part.col_end, cols};
  MOET_CHECK(0 <= p.r0 && p.r0 < p.r1 && p.r1 <= shape[0] && 0 <= p.c0 && p.c0 < p.c1 && p.c1 <= cols &&
                 (p.all_columns() || shape.size() == 2),
             "tensor '{}' [{}]: no part rows [{}, {}) columns [{}, {})", name, fmt::join(shape, ", "), p.r0, p.r1,
             p.c0, p.c1);
  return p;
}

// The shape of `part` of a tensor of `shape`.
std::vector<int64_t> part_shape(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part) {
  if (part.whole()) return shape;
  const PartRange p = resolve(name, shape, part);
  std::vector<int64_t> out = shape;
  out[0] = p.r1 - p.r0;
  if (shape.size() == 2) out[1] = p.c1 - p.c0;
  return out;
}

// Whether [begin, end) of an FP8-block dimension keeps its 128-blocks: it starts on a block edge or
// lies inside one block (the part's own blocks are then the checkpoint's).
bool fp8_part_aligned(int64_t begin, int64_t end) {
  return begin % kFp8Block == 0 || begin / kFp8Block == (end - 1) / kFp8Block;
}

}  // namespace

WeightLoader WeightLoader::random(Backend& backend, uint64_t seed, bool fp8_dense, double zipf) {
  MOET_CHECK(zipf >= 0.0, "a Zipf exponent must be >= 0 (got {})", zipf);
  return WeightLoader(backend, seed, fp8_dense, zipf);
}

Tensor WeightLoader::router_bias(int64_t layer, int64_t experts) {
  if (checkpoint_ != nullptr || zipf_ == 0.0) return {};
  std::vector<int64_t> rank(static_cast<size_t>(experts));
  std::iota(rank.begin(), rank.end(), 0);
  std::mt19937_64 rng(0x5bd1e995u + uint64_t(layer));  // a fixed permutation per layer
  std::shuffle(rank.begin(), rank.end(), rng);
  std::vector<float> bias(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) bias[size_t(e)] = float(-zipf_ * std::log(double(rank[size_t(e)] + 1)));
  const HostTensor info{"router bias (zipf)", DType::f32, {experts}, reinterpret_cast<const uint8_t*>(bias.data()),
                        bias.size() * sizeof(float), "(invented)"};
  return backend_.upload(info);
}

bool WeightLoader::has(const std::string& name) const {
  return checkpoint_ ? checkpoint_->find(name) != nullptr : !ends_with(name, ".bias");
}

const HostTensor& WeightLoader::keep(HostTensor info, std::unique_ptr<uint8_t[]> bytes) {
  if (invented_.size() >= 4) invented_.pop_front();
  info.data = bytes.get();
  invented_.emplace_back(std::move(info), std::move(bytes));
  return invented_.back().first;
}

const HostTensor& WeightLoader::invent(const std::string& name, const std::vector<int64_t>& shape) {
  return invent_as<uint16_t>(name, shape, DType::bf16, float_to_bf16);
}

// Each chunk of kInventChunk values draws from its own generator, seeded from the tensor's seed
// (one draw of rng_ per tensor) and the chunk's index, so the values do not depend on the thread
// count; one normal draw per 64 values, varied along them, keeps invention fast at full-size
// shapes (Qwen3-235B: 16 GB of dense weights).
template <typename T, typename Encode>
const HostTensor& WeightLoader::invent_as(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                                          Encode encode) {
  constexpr int64_t kInventChunk = int64_t(1) << 16;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::unique_ptr<uint8_t[]> bytes(new uint8_t[size_t(count) * sizeof(T)]);  // every byte written below
  auto* values = reinterpret_cast<T*>(bytes.get());
  const bool norm = ends_with(name, "norm.weight");
  const bool bias = ends_with(name, "correction_bias");
  const uint64_t tensor_seed = rng_();
  if (!pool_) pool_ = std::make_unique<ThreadPool>();
  pool_->parallel_for(size_t((count + kInventChunk - 1) / kInventChunk), [&](size_t begin, size_t end) {
    for (size_t chunk = begin; chunk < end; ++chunk) {
      std::mt19937_64 rng(tensor_seed + 0x9e3779b97f4a7c15ull * (chunk + 1));
      std::normal_distribution<float> normal(0.0f, 0.02f);
      const int64_t first = int64_t(chunk) * kInventChunk, last = std::min(count, first + kInventChunk);
      for (int64_t i = first; i < last; i += 64) {
        const float base = normal(rng);
        for (int64_t j = i; j < std::min(last, i + 64); ++j)
          values[j] = encode(norm   ? 1.0f
                             : bias ? 0.0f
                                    : base * (1.0f + 0.01f * float(j - i)) * ((j & 1) ? -1.0f : 1.0f));
      }
    }
  });
  return keep(HostTensor{name, dtype, shape, nullptr, size_t(count) * sizeof(T), "(random)"}, std::move(bytes));
}

bool WeightLoader::is_plain_float(const std::string& name) const {
  if (checkpoint_ == nullptr) return true;
  const HostTensor* found = checkpoint_->find(name);
  return found == nullptr || found->dtype == DType::bf16 || found->dtype == DType::f16 || found->dtype == DType::f32;
}

void WeightLoader::mark_used(const std::string& name) {
  const std::string stem = ends_with(name, ".weight") ? name.substr(0, name.size() - 6) : name;
  for (const auto& candidate : checkpoint_->names())
    if (candidate == name || (candidate.rfind(stem, 0) == 0 && candidate.find('.', stem.size()) == std::string::npos))
      used_.insert(candidate);
}

void WeightLoader::count_read(const std::string& name, uint64_t bytes) {
  stats_.bytes_read += bytes;
  stats_.read_by_tensor[name] += bytes;
}

const HostTensor& WeightLoader::part_of(const HostTensor& whole, const WeightPart& part, bool read) {
  const PartRange p = resolve(whole.name, whole.shape, part);
  const size_t elem = dtype_size(whole.dtype), width = size_t(p.c1 - p.c0) * elem;
  HostTensor info{whole.name, whole.dtype, part_shape(whole.name, whole.shape, part), nullptr,
                  size_t(p.r1 - p.r0) * width, whole.file};
  if (read) count_read(whole.name, info.bytes);
  if (p.all_columns()) {  // whole rows: a view
    info.data = whole.data + size_t(p.r0 * p.cols) * elem;
    if (views_.size() >= 4) views_.pop_front();
    views_.push_back(std::move(info));
    return views_.back();
  }
  std::unique_ptr<uint8_t[]> bytes(new uint8_t[info.bytes]);
  for (int64_t r = p.r0; r < p.r1; ++r)
    std::memcpy(bytes.get() + size_t(r - p.r0) * width, whole.data + size_t(r * p.cols + p.c0) * elem, width);
  return keep(std::move(info), std::move(bytes));
}

const HostTensor& WeightLoader::decoded(const std::string& name, const std::vector<int64_t>& shape) {
  const SourceView view = checkpoint_source_view(*checkpoint_, name);
  MOET_CHECK(shape.size() == 2 && view.rows == shape[0] && view.cols == shape[1],
             "tensor '{}' decodes to [{}, {}] but the config implies [{}]", name, view.rows, view.cols,
             fmt::join(shape, ", "));
  if (view.format == SourceFormat::fp8_block)
    fp8_scales(*checkpoint_, name, view.rows, view.cols, view.block_rows, view.block_cols);
  const std::vector<double> values = source_dequant(view);
  std::unique_ptr<uint8_t[]> bytes(new uint8_t[values.size() * sizeof(float)]);
  auto* out = reinterpret_cast<float*>(bytes.get());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float(values[i]);
  const std::set<std::string> before = used_;
  mark_used(name);
  for (const std::string& companion : used_)  // the codes and their scales, read whole
    if (before.count(companion) == 0) count_read(name, checkpoint_->get(companion).bytes);
  return keep(HostTensor{name, DType::f32, shape, nullptr, values.size() * sizeof(float), "(decoded)"},
              std::move(bytes));
}

const HostTensor& WeightLoader::info(const std::string& name, const std::vector<int64_t>& shape,
                                     const WeightPart& part) {
  if (checkpoint_ == nullptr) return invent(name, part_shape(name, shape, part));
  const HostTensor* found = checkpoint_->find(name);
  MOET_CHECK(found != nullptr, "{}: tensor '{}' is missing from the checkpoint",
             checkpoint_->dir().string(), name);
  if (!is_plain_float(name)) {
    const HostTensor& whole = decoded(name, shape);
    return part.whole() ? whole : part_of(whole, part, false);
  }
  check_shape(*found, shape);
  used_.insert(name);
  if (!part.whole()) return part_of(*found, part, true);
  count_read(name, found->bytes);
  return *found;
}

bool WeightLoader::keeps_fp8(const std::string& name, const std::vector<int64_t>& shape,
                             const WeightPart& part) const {
  if (checkpoint_ == nullptr) return fp8_dense_;
  const HostTensor* found = checkpoint_->find(name);
  if (found == nullptr || found->dtype != DType::f8_e4m3 || !fp8_blocks_of_128(*checkpoint_)) return false;
  if (part.whole()) return true;
  const PartRange p = resolve(name, shape, part);
  return shape.size() == 2 && fp8_part_aligned(p.r0, p.r1) && fp8_part_aligned(p.c0, p.c1);
}

// Invented codes are e4m3 of the invented values over kInventedFp8Scale (through BF16, a 64 KiB
// table: fast at full-size shapes).
WeightLoader::Fp8Host WeightLoader::fp8_host(const std::string& name, const std::vector<int64_t>& shape,
                                             const WeightPart& part) {
  MOET_CHECK(shape.size() == 2, "FP8-block weight '{}' must be a matrix", name);
  const std::vector<int64_t> own = part_shape(name, shape, part);
  const std::vector<int64_t> scale_shape = fp8_block_scale_shape(own[0], own[1]);
  std::vector<float> scales(static_cast<size_t>(scale_shape[0] * scale_shape[1]), kInventedFp8Scale);
  if (checkpoint_ == nullptr) {
    static const std::vector<uint8_t> table = [] {
      std::vector<uint8_t> t(size_t(1) << 16);
      for (size_t bits = 0; bits < t.size(); ++bits) t[bits] = e4m3_from_double(bf16_to_float(uint16_t(bits)));
      return t;
    }();
    const auto encode = [](float v) { return table[float_to_bf16(v / kInventedFp8Scale)]; };
    return {&invent_as<uint8_t>(name, own, DType::f8_e4m3, encode), std::move(scales)};
  }
  const HostTensor& codes = checkpoint_->get(name);
  check_shape(codes, shape);
  const HostTensor& stored = fp8_scales(*checkpoint_, name, shape[0], shape[1], kFp8Block, kFp8Block);
  // The part's scale blocks: those of its first row and column on (keeps_fp8() checked the edges).
  const PartRange p = resolve(name, shape, part);
  const int64_t stored_cols = stored.shape[1], row0 = p.r0 / kFp8Block, col0 = p.c0 / kFp8Block;
  const size_t elem = dtype_size(stored.dtype);
  for (int64_t i = 0; i < scale_shape[0]; ++i) {
    for (int64_t j = 0; j < scale_shape[1]; ++j) {
      const uint8_t* at = stored.data + size_t((row0 + i) * stored_cols + col0 + j) * elem;
      float& scale = scales[size_t(i * scale_shape[1] + j)];
      if (stored.dtype == DType::f32) {
        std::memcpy(&scale, at, sizeof(float));
      } else {
        uint16_t bits;
        std::memcpy(&bits, at, sizeof(uint16_t));
        scale = bf16_to_float(bits);
      }
    }
  }
  mark_used(name);
  count_read(name + "_scale_inv", scales.size() * elem);
  if (part.whole()) {
    count_read(name, codes.bytes);
    return {&codes, std::move(scales)};
  }
  return {&part_of(codes, part, true), std::move(scales)};
}

Tensor WeightLoader::fp8_upload(const std::string& name, Tensor codes, const std::vector<float>& scales) {
  const HostTensor info{name + "_scale_inv", DType::f32, fp8_block_scale_shape(codes.dim(0), codes.dim(1)),
                        reinterpret_cast<const uint8_t*>(scales.data()), scales.size() * sizeof(float), "(scales)"};
  return counted(name, fp8_block_weight(std::move(codes), backend_.upload(info), name));
}

Tensor WeightLoader::matmul_weight(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part) {
  if (!keeps_fp8(name, shape, part)) return weight(name, shape, part);
  const Fp8Host w = fp8_host(name, shape, part);
  return fp8_upload(name, backend_.upload(as_bytes(*w.codes)), w.scales);
}

Tensor WeightLoader::matmul_stacked(const std::string& a, const std::string& b,
                                    const std::vector<int64_t>& shape_each, const WeightPart& part) {
  if (!keeps_fp8(a, shape_each, part) || !keeps_fp8(b, shape_each, part) || shape_each.size() != 2 ||
      part_shape(a, shape_each, part)[0] % kFp8Block != 0)
    return stacked(a, b, shape_each, part);
  Fp8Host first = fp8_host(a, shape_each, part);
  const Fp8Host second = fp8_host(b, shape_each, part);
  first.scales.insert(first.scales.end(), second.scales.begin(), second.scales.end());
  return fp8_upload(a, backend_.upload_stacked(as_bytes(*first.codes), as_bytes(*second.codes)), first.scales);
}

// An FP8-block weight counts its codes and its scales.
Tensor WeightLoader::counted(const std::string& name, Tensor tensor) {
  const uint64_t bytes = tensor.bytes() + (tensor.block_scales ? tensor.block_scales->bytes() : 0);
  stats_.bytes += bytes;
  if (name.find(".experts.") != std::string::npos) stats_.routed_bytes += bytes;
  if (name == "model.embed_tokens.weight") stats_.embedding_bytes += bytes;
  return tensor;
}

Tensor WeightLoader::weight(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part) {
  return counted(name, backend_.upload(info(name, shape, part)));
}

Tensor WeightLoader::weight_f32(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part) {
  return counted(name, backend_.upload_f32(info(name, shape, part)));
}

Tensor WeightLoader::stacked(const std::string& a, const std::string& b, const std::vector<int64_t>& shape_each,
                             const WeightPart& part) {
  const HostTensor& first = info(a, shape_each, part);
  return counted(a, backend_.upload_stacked(first, info(b, shape_each, part)));
}

size_t WeightLoader::report_unused() const {
  if (checkpoint_ == nullptr) return 0;
  size_t unused = 0;
  for (const auto& name : checkpoint_->names()) {
    if (used_.count(name)) continue;
    ++unused;
    MOET_LOG_DEBUG("skipping unused tensor '{}'", name);
  }
  if (unused > 0) MOET_LOG_INFO("{} checkpoint tensors are not used by this engine (e.g. MTP layers); skipped", unused);
  return unused;
}

}  // namespace moet
