// Helpers for the pack tests: a temp directory, and synthetic BF16 experts (deterministic per
// (layer, expert)) so packs can be built without a checkpoint.
#pragma once

#include "core/dtype.h"
#include "io/pack_writer.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace moet::test {

inline std::filesystem::path temp_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("moet-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 0.05f);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = float_to_bf16(normal(rng));
  return out;
}

// Owns synthetic BF16 gate/up/down tensors for every (layer, expert).
class SyntheticExperts {
 public:
  SyntheticExperts(int64_t hidden, int64_t intermediate) : hidden_(hidden), intermediate_(intermediate) {}

  ExpertSources get(int64_t layer, int64_t expert) {
    auto& t = tensors_[{layer, expert}];
    if (t.empty()) {
      const uint32_t seed = uint32_t(layer * 1000 + expert);
      t.push_back(random_bf16(size_t(intermediate_ * hidden_), seed * 3));
      t.push_back(random_bf16(size_t(intermediate_ * hidden_), seed * 3 + 1));
      t.push_back(random_bf16(size_t(intermediate_ * hidden_), seed * 3 + 2));
    }
    return {view(t[0], intermediate_, hidden_), view(t[1], intermediate_, hidden_), view(t[2], hidden_, intermediate_)};
  }

  ExpertSourceFn fn() {
    return [this](int64_t layer, int64_t expert) { return get(layer, expert); };
  }

 private:
  static SourceView view(const std::vector<uint16_t>& data, int64_t rows, int64_t cols) {
    SourceView v;
    v.format = SourceFormat::bf16;
    v.rows = rows;
    v.cols = cols;
    v.data = reinterpret_cast<const uint8_t*>(data.data());
    v.name = "synthetic";
    return v;
  }

  int64_t hidden_, intermediate_;
  std::map<std::pair<int64_t, int64_t>, std::vector<std::vector<uint16_t>>> tensors_;
};

inline PackSpec small_spec() {
  PackSpec spec;
  spec.format = StoreFormat::w2;
  spec.zero_mode = ZeroMode::automatic;
  spec.identity = "test-identity";
  spec.n_layers = 3;
  spec.n_experts = 4;
  spec.hidden = 64;
  spec.intermediate = 96;
  spec.layers = {1, 2};
  return spec;
}

}  // namespace moet::test
