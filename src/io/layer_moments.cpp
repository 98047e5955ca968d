// Layer-moments files (see layer_moments.h).
#include "io/layer_moments.h"

#include "core/error.h"
#include "io/imatrix.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

namespace moet {
namespace {

std::string matrix_key(int64_t layer, bool down) {
  return fmt::format("layers.{}.{}", layer, down ? "down_in" : "gate_up_in");
}

TensorToWrite matrix_tensor(int64_t layer, bool down, int64_t k, const std::vector<float>& m) {
  MOET_CHECK(k * k == int64_t(m.size()), "layer moments: {} has {} values, not {}^2", matrix_key(layer, down),
             m.size(), k);
  TensorToWrite t{matrix_key(layer, down), DType::f32, {k, k}, std::vector<uint8_t>(m.size() * sizeof(float))};
  std::memcpy(t.bytes.data(), m.data(), t.bytes.size());
  return t;
}

}  // namespace

std::string layer_moments_write(const std::filesystem::path& path, const LayerMomentsData& data) {
  std::vector<TensorToWrite> tensors;
  for (const auto& [layer, matrices] : data.layers) {
    tensors.push_back(matrix_tensor(layer, false, data.hidden, matrices.gate_up_in));
    tensors.push_back(matrix_tensor(layer, true, data.inner, matrices.down_in));
  }
  safetensors_write(path, tensors,
                    {{"format", kLayerMomentsFormat},
                     {"checkpoint_identity", data.checkpoint_identity},
                     {"tokens", std::to_string(data.tokens)},
                     {"pairs", std::to_string(data.pairs)}});
  return file_xxh64(path);
}

std::shared_ptr<const LayerMoments> LayerMoments::read(const std::filesystem::path& path) {
  auto m = std::make_shared<LayerMoments>();
  m->path_ = path.string();
  m->file_ = moet_file_open(path, kLayerMomentsFormat, "layer-moments file", "moet imatrix --layer-moments");
  for (const HostTensor& t : m->file_->tensors()) {
    long long layer = -1;
    char what[16] = {};
    const bool named = std::sscanf(t.name.c_str(), "layers.%lld.%15s", &layer, what) == 2 && layer >= 0 &&
                       t.name == matrix_key(layer, std::string(what) == "down_in");
    MOET_CHECK(named && t.dtype == DType::f32 && t.shape.size() == 2 && t.shape[0] == t.shape[1],
               "layer moments {}: unexpected tensor '{}' {} {}", m->path_, t.name, dtype_name(t.dtype),
               t.shape_text());
    m->tensors_[{layer, std::string(what) == "down_in"}] = &t;
  }
  m->hash_ = file_xxh64(path);
  return m;
}

void LayerMoments::check(const ModelConfig& config) const {
  const auto refuse = [&](const std::string& why) {
    fail("layer moments {} were made for another model ({}); make them for this model with `moet imatrix "
         "--layer-moments`",
         path_, why);
  };
  size_t moe_layers = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (!config.layer_is_moe[size_t(layer)]) continue;
    ++moe_layers;
    for (const bool down : {false, true}) {
      const auto it = tensors_.find({layer, down});
      if (it == tensors_.end()) refuse(fmt::format("no {}", matrix_key(layer, down)));
      const int64_t k = down ? config.moe_intermediate_size : config.hidden_size;
      if (it->second->shape[0] != k)
        refuse(fmt::format("{} is {}, the model's experts take {} inputs", it->first.second ? "down" : "gate_up",
                           it->second->shape_text(), k));
    }
  }
  if (tensors_.size() != 2 * moe_layers)
    refuse(fmt::format("{} matrices, the model has {} MoE layers", tensors_.size(), moe_layers));
}

const HostTensor* LayerMoments::matrix(int64_t layer, bool down) const {
  const auto it = tensors_.find({layer, down});
  return it == tensors_.end() ? nullptr : it->second;
}

}  // namespace moet
