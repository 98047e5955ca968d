// Per-expert second-moment files (see expert_moments.h).
#include "io/expert_moments.h"

#include "core/error.h"
#include "io/imatrix.h"

#include <fmt/format.h>

#include <cstring>

namespace moet {

std::shared_ptr<const ExpertMoments> ExpertMoments::read(const std::filesystem::path& path) {
  auto m = std::make_shared<ExpertMoments>();
  m->path_ = path.string();
  m->file_ = moet_file_open(path, kSecondMomentsFormat, "expert-moments file", "moet imatrix --expert-moments");
  for (const HostTensor& t : m->file_->tensors()) {
    int64_t layer = -1, expert = -1;
    std::string what;
    const bool named = imatrix_parse_key(t.name, &layer, &expert, &what) && layer >= 0;
    if (named && expert < 0 && t.dtype == DType::i32 && t.shape.size() == 1) {
      std::vector<int32_t>& counts = m->tokens_[layer];
      counts.resize(size_t(t.shape[0]));
      std::memcpy(counts.data(), t.data, t.bytes);
      continue;
    }
    MOET_CHECK(named && expert >= 0 && t.dtype == DType::f32 && t.shape.size() == 2 && t.shape[0] == t.shape[1],
               "expert moments {}: unexpected tensor '{}' {} {}", m->path_, t.name, dtype_name(t.dtype),
               t.shape_text());
    auto& pair = m->matrices_[{layer, expert}];
    (what == "down_in" ? pair.second : pair.first) = &t;
  }
  for (const auto& [key, pair] : m->matrices_)
    MOET_CHECK(pair.first != nullptr && pair.second != nullptr, "expert moments {}: layer {} expert {} has only {}",
               m->path_, key.first, key.second, pair.first ? "gate_up_in" : "down_in");
  m->hash_ = file_xxh64(path);
  return m;
}

void ExpertMoments::check(const ModelConfig& config) const {
  const auto refuse = [&](const std::string& why) {
    fail("expert moments {} were made for another model ({}); make them for this model with `moet imatrix "
         "--expert-moments`",
         path_, why);
  };
  const auto moe = [&](int64_t layer) {
    return layer < config.num_hidden_layers && config.layer_is_moe[size_t(layer)];
  };
  for (const auto& [layer, counts] : tokens_)
    if (!moe(layer) || int64_t(counts.size()) != config.n_routed_experts)
      refuse(fmt::format("layer {} has {} experts' token counts, the model {}", layer, counts.size(),
                         moe(layer) ? config.n_routed_experts : 0));
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    if (moe(layer) && !tokens_.contains(layer)) refuse(fmt::format("no layers.{}.expert_tokens", layer));
  for (const auto& [key, pair] : matrices_) {
    const auto [layer, expert] = key;
    if (!moe(layer) || expert >= config.n_routed_experts)
      refuse(fmt::format("{}: the model has no such MoE layer and expert", pair.first->name));
    for (const HostTensor* t : {pair.first, pair.second}) {
      const int64_t k = t == pair.second ? config.moe_intermediate_size : config.hidden_size;
      if (t->shape[0] != k) refuse(fmt::format("{} is {}, the model's experts take {} inputs", t->name, t->shape_text(), k));
    }
  }
}

std::string ExpertMoments::first_missing(const ModelConfig& config) const {
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (!config.layer_is_moe[size_t(layer)]) continue;
    for (int64_t e = 0; e < config.n_routed_experts; ++e)
      if (!matrices_.contains({layer, e})) return fmt::format("layer {} expert {}", layer, e);
  }
  return "";
}

const HostTensor* ExpertMoments::matrix(int64_t layer, int64_t expert, bool down) const {
  const auto it = matrices_.find({layer, expert});
  if (it == matrices_.end()) return nullptr;
  return down ? it->second.second : it->second.first;
}

int64_t ExpertMoments::tokens(int64_t layer, int64_t expert) const {
  const auto it = tokens_.find(layer);
  return it == tokens_.end() || expert < 0 || size_t(expert) >= it->second.size() ? 0 : it->second[size_t(expert)];
}

}  // namespace moet
