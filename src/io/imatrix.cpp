// Importance matrix files (see imatrix.h).
#include "io/imatrix.h"

#include "core/error.h"
#include "io/safetensors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

namespace moet {
namespace {

std::string tokens_key(int64_t layer) { return fmt::format("layers.{}.expert_tokens", layer); }

template <typename T>
TensorToWrite vector_tensor(std::string name, DType dtype, const std::vector<T>& values,
                            std::vector<int64_t> shape = {}) {
  TensorToWrite t{std::move(name), dtype, shape.empty() ? std::vector<int64_t>{int64_t(values.size())} : shape, {}};
  t.bytes.resize(values.size() * sizeof(T));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

}  // namespace

std::string imatrix_expert_key(int64_t layer, int64_t expert, bool down) {
  return fmt::format("layers.{}.experts.{}.{}", layer, expert, down ? "down_in" : "gate_up_in");
}

bool imatrix_parse_key(const std::string& name, int64_t* layer, int64_t* expert, std::string* what) {
  char tail[32] = {};
  long long l = -1, e = -1;
  if (std::sscanf(name.c_str(), "layers.%lld.experts.%lld.%31s", &l, &e, tail) == 3) {
    *layer = l, *expert = e, *what = tail;
    return name == imatrix_expert_key(l, e, *what == "down_in");
  }
  if (std::sscanf(name.c_str(), "layers.%lld.expert_tokens", &l) == 1 && name == tokens_key(l)) {
    *layer = l, *expert = -1, *what = "expert_tokens";
    return true;
  }
  return false;
}

std::unique_ptr<SafetensorsFile> moet_file_open(const std::filesystem::path& path, std::string_view format,
                                                std::string_view what, std::string_view how) {
  auto file = SafetensorsFile::open(path);
  const nlohmann::json header = nlohmann::json::parse(file->header_json());
  const nlohmann::json meta = header.value("__metadata__", nlohmann::json::object());
  MOET_CHECK(meta.value("format", "") == format, "{} is not a moet {} (no __metadata__ format '{}'; make one with `{}`)",
             path.string(), what, format, how);
  return file;
}

std::string file_xxh64(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MOET_CHECK(in.good(), "{}: cannot open", path.string());
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  std::vector<char> chunk(size_t(1) << 20);
  while (in) {
    in.read(chunk.data(), std::streamsize(chunk.size()));
    XXH64_update(state.get(), chunk.data(), size_t(in.gcount()));
  }
  return fmt::format("{:016x}", XXH64_digest(state.get()));
}

const float* Imatrix::input(int64_t layer, int64_t expert, bool down) const {
  const auto it = layers.find(layer);
  if (it == layers.end() || expert < 0 || size_t(expert) >= it->second.size()) return nullptr;
  const ImatrixExpert& e = it->second[size_t(expert)];
  const std::vector<float>& v = down ? e.down_in : e.gate_up_in;
  return v.empty() ? nullptr : v.data();
}

namespace {

// The file of the vectors (second_moments false) or of the full matrices.
std::string write_file(const std::filesystem::path& path, const Imatrix& imatrix, bool second_moments) {
  std::vector<TensorToWrite> tensors;
  for (const auto& [layer_id, experts] : imatrix.layers) {
    const int64_t layer = layer_id;  // a structured binding cannot be captured by the lambda below in C++20
    for (size_t e = 0; e < experts.size(); ++e) {
      const ImatrixExpert& x = experts[e];
      const auto add = [&](bool down, const std::vector<float>& vector, const std::vector<float>& matrix) {
        const std::string key = imatrix_expert_key(layer, int64_t(e), down);
        const int64_t k = int64_t(vector.size());
        if (!second_moments) return tensors.push_back(vector_tensor(key, DType::f32, vector));
        if (matrix.empty()) return;  // an expert whose second moments were not collected
        MOET_CHECK(int64_t(matrix.size()) == k * k, "imatrix: {} has {} second moments, not {}^2", key, matrix.size(), k);
        tensors.push_back(vector_tensor(key, DType::f32, matrix, {k, k}));
      };
      add(false, x.gate_up_in, x.gate_up_xx);
      add(true, x.down_in, x.down_xx);
    }
  }
  for (const auto& [layer, counts] : imatrix.expert_tokens)
    tensors.push_back(vector_tensor(tokens_key(layer), DType::i32, counts));
  safetensors_write(path, tensors,
                    {{"format", second_moments ? kSecondMomentsFormat : kImatrixFormat},
                     {"checkpoint_identity", imatrix.checkpoint_identity},
                     {"tokens", std::to_string(imatrix.tokens)},
                     {"min_tokens", std::to_string(imatrix.min_tokens)}});
  return file_xxh64(path);
}

}  // namespace

std::string imatrix_write(const std::filesystem::path& path, const Imatrix& imatrix) {
  return write_file(path, imatrix, false);
}

std::string imatrix_second_moments_write(const std::filesystem::path& path, const Imatrix& imatrix) {
  return write_file(path, imatrix, true);
}

Imatrix imatrix_read(const std::filesystem::path& path) {
  const std::string file = path.string();
  const auto st = moet_file_open(path, kImatrixFormat, "importance matrix", "moet imatrix");
  const nlohmann::json meta = nlohmann::json::parse(st->header_json()).at("__metadata__");
  Imatrix m;
  try {
    m.checkpoint_identity = meta.at("checkpoint_identity").get<std::string>();
    m.tokens = std::stoll(meta.at("tokens").get<std::string>());
    m.min_tokens = std::stoll(meta.at("min_tokens").get<std::string>());
  } catch (const std::exception& e) {
    fail("imatrix {}: bad __metadata__ ({})", file, e.what());
  }
  for (const HostTensor& t : st->tensors()) {
    int64_t layer = -1, expert = -1;
    std::string what;
    MOET_CHECK(imatrix_parse_key(t.name, &layer, &expert, &what) && layer >= 0 && t.shape.size() == 1,
               "imatrix {}: unexpected tensor '{}' {}", file, t.name, t.shape_text());
    if (expert < 0) {
      MOET_CHECK(t.dtype == DType::i32, "imatrix {}: {} must be I32", file, t.name);
      std::vector<int32_t>& counts = m.expert_tokens[layer];
      counts.resize(size_t(t.shape[0]));
      std::memcpy(counts.data(), t.data, t.bytes);
      continue;
    }
    MOET_CHECK(t.dtype == DType::f32, "imatrix {}: {} must be F32", file, t.name);
    std::vector<ImatrixExpert>& experts = m.layers[layer];
    if (experts.size() <= size_t(expert)) experts.resize(size_t(expert) + 1);
    std::vector<float>& v = what == "down_in" ? experts[size_t(expert)].down_in : experts[size_t(expert)].gate_up_in;
    v.resize(size_t(t.shape[0]));
    std::memcpy(v.data(), t.data, t.bytes);
  }
  m.hash = file_xxh64(path);
  m.path = file;
  return m;
}

void imatrix_check(const Imatrix& imatrix, const ModelConfig& config, const std::string& file) {
  const auto refuse = [&](const std::string& why) {
    fail("imatrix {} was made for another model ({}); make one for this model with `moet imatrix`", file, why);
  };
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l)
    if (config.layer_is_moe[size_t(l)]) moe_layers.push_back(l);
  if (imatrix.layers.size() != moe_layers.size())
    refuse(fmt::format("{} MoE layers, the model has {}", imatrix.layers.size(), moe_layers.size()));
  for (int64_t layer : moe_layers) {
    const auto it = imatrix.layers.find(layer);
    if (it == imatrix.layers.end()) refuse(fmt::format("no layer {}", layer));
    if (int64_t(it->second.size()) != config.n_routed_experts)
      refuse(fmt::format("layer {} has {} experts, the model {}", layer, it->second.size(), config.n_routed_experts));
    for (size_t e = 0; e < it->second.size(); ++e) {
      const ImatrixExpert& x = it->second[e];
      const int64_t gate_up = int64_t(x.gate_up_in.size()), down = int64_t(x.down_in.size());
      if (gate_up != config.hidden_size || down != config.moe_intermediate_size)
        refuse(fmt::format("{} / {} have {} / {} columns, the model's experts {} / {}",
                           imatrix_expert_key(layer, int64_t(e), false), imatrix_expert_key(layer, int64_t(e), true), gate_up, down,
                           config.hidden_size, config.moe_intermediate_size));
    }
  }
}

}  // namespace moet
