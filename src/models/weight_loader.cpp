// WeightLoader implementation (see weight_loader.h).
#include "models/weight_loader.h"

#include "core/error.h"
#include "core/log.h"
#include "formats/checkpoint_formats.h"
#include "io/pack_source.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

namespace moet {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

WeightLoader WeightLoader::random(Backend& backend, uint64_t seed) { return WeightLoader(backend, seed); }

bool WeightLoader::has(const std::string& name) const {
  return checkpoint_ ? checkpoint_->find(name) != nullptr : !ends_with(name, ".bias");
}

const TensorInfo& WeightLoader::keep(TensorInfo info, std::unique_ptr<uint8_t[]> bytes) {
  if (invented_.size() >= 2) invented_.pop_front();
  info.data = bytes.get();
  invented_.emplace_back(std::move(info), std::move(bytes));
  return invented_.back().first;
}

// Each chunk of kInventChunk values draws from its own generator, seeded from the tensor's seed
// (one draw of rng_ per tensor) and the chunk's index, so the values do not depend on the thread
// count; one normal draw per 64 values, varied along them, keeps invention fast at full-size
// shapes (Qwen3-235B: 16 GB of dense weights).
const TensorInfo& WeightLoader::invent(const std::string& name, const std::vector<int64_t>& shape) {
  constexpr int64_t kInventChunk = int64_t(1) << 16;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::unique_ptr<uint8_t[]> bytes(new uint8_t[size_t(count) * 2]);  // every byte written below
  auto* values = reinterpret_cast<uint16_t*>(bytes.get());
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
          values[j] = float_to_bf16(norm   ? 1.0f
                                    : bias ? 0.0f
                                           : base * (1.0f + 0.01f * float(j - i)) * ((j & 1) ? -1.0f : 1.0f));
      }
    }
  });
  return keep(TensorInfo{name, DType::bf16, shape, nullptr, size_t(count) * 2, "(random)"}, std::move(bytes));
}

bool WeightLoader::is_plain_float(const std::string& name) const {
  if (checkpoint_ == nullptr) return true;
  const TensorInfo* found = checkpoint_->find(name);
  return found == nullptr || found->dtype == DType::bf16 || found->dtype == DType::f16 || found->dtype == DType::f32;
}

void WeightLoader::mark_used_family(const std::string& name) {
  const std::string stem = ends_with(name, ".weight") ? name.substr(0, name.size() - 6) : name;
  for (const auto& candidate : checkpoint_->names())
    if (candidate == name || (candidate.rfind(stem, 0) == 0 && candidate.find('.', stem.size()) == std::string::npos))
      used_.insert(candidate);
}

const TensorInfo& WeightLoader::decoded(const std::string& name, const std::vector<int64_t>& shape) {
  const SourceView view = checkpoint_source_view(*checkpoint_, name);
  MOET_CHECK(shape.size() == 2 && view.rows == shape[0] && view.cols == shape[1],
             "tensor '{}' decodes to [{}, {}] but the config implies [{}]", name, view.rows, view.cols,
             fmt::join(shape, ", "));
  const std::vector<double> values = source_dequant(view);
  std::unique_ptr<uint8_t[]> bytes(new uint8_t[values.size() * sizeof(float)]);
  auto* out = reinterpret_cast<float*>(bytes.get());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float(values[i]);
  mark_used_family(name);
  return keep(TensorInfo{name, DType::f32, shape, nullptr, values.size() * sizeof(float), "(decoded)"},
              std::move(bytes));
}

const TensorInfo& WeightLoader::info(const std::string& name, const std::vector<int64_t>& shape) {
  if (checkpoint_ == nullptr) return invent(name, shape);
  const TensorInfo* found = checkpoint_->find(name);
  MOET_CHECK(found != nullptr, "{}: tensor '{}' is missing from the checkpoint",
             checkpoint_->dir().string(), name);
  if (!is_plain_float(name)) return decoded(name, shape);
  MOET_CHECK(found->shape == shape, "tensor '{}' in {} has shape {} but the config implies [{}]", name,
             found->file, found->shape_text(), fmt::join(shape, ", "));
  used_.insert(name);
  return *found;
}

Tensor WeightLoader::counted(const std::string& name, Tensor tensor) {
  stats_.bytes += tensor.bytes();
  if (name.find(".experts.") != std::string::npos) stats_.routed_bytes += tensor.bytes();
  if (name == "model.embed_tokens.weight") stats_.embedding_bytes += tensor.bytes();
  return tensor;
}

Tensor WeightLoader::weight(const std::string& name, const std::vector<int64_t>& shape) {
  return counted(name, backend_.upload(info(name, shape)));
}

Tensor WeightLoader::weight_f32(const std::string& name, const std::vector<int64_t>& shape) {
  return counted(name, backend_.upload_f32(info(name, shape)));
}

Tensor WeightLoader::stacked(const std::string& a, const std::string& b, const std::vector<int64_t>& shape_each) {
  const TensorInfo& first = info(a, shape_each);
  return counted(a, backend_.upload_stacked(first, info(b, shape_each)));
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
