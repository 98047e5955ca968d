// A model's per-expert second moments, read for W2K's LDLQ quantizer: the file `moet imatrix
// --expert-moments F` writes (io/imatrix.h's "moet-imatrix-second-moments-v1"), each expert's own
//   layers.<L>.experts.<e>.gate_up_in   F32 [hidden, hidden]   E[x x^T] over the rows routed to e
//   layers.<L>.experts.<e>.down_in      F32 [inner, inner]     E[a a^T] of those rows
//   layers.<L>.expert_tokens            I32 [experts]          tokens routed to each expert
// for every expert or only some (--expert-moments-top N: each layer's N hottest); expert_tokens
// always covers every expert. An expert's two matrices are present together or not at all.
// A file belongs to a model when every tensor names an MoE layer and expert of it with its
// shapes and each MoE layer has its token counts (ExpertMoments::check); whether it covers every
// expert is a separate question (first_missing: the quantizer needs layer moments for the rest).
// Its identity is the xxh64 of the file's bytes; packs quantized with it record it. The matrices
// stay in the memory-mapped file until a quantizer copies one out (io/ldlq_moments.h).
#pragma once

#include "io/model_config.h"
#include "io/safetensors.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moet {

class ExpertMoments {
 public:
  // Throws naming the file when it is not one (or an expert has one matrix of the two).
  static std::shared_ptr<const ExpertMoments> read(const std::filesystem::path& path);
  // Throws "expert moments F were made for another model (...)" unless every matrix is of an MoE
  // layer and routed expert of `config` with its shape and every MoE layer has its token counts.
  void check(const ModelConfig& config) const;
  // The first expert of `config`'s MoE layers without matrices ("layer L expert e"); "" when the
  // file covers every expert.
  std::string first_missing(const ModelConfig& config) const;
  // The F32 [K, K] matrix of (layer, expert, input) in the mapped file; null when the file has none.
  const HostTensor* matrix(int64_t layer, int64_t expert, bool down) const;
  // Tokens routed to (layer, expert) on the text the file was measured on (0 for an unknown one).
  int64_t tokens(int64_t layer, int64_t expert) const;
  const std::string& hash() const { return hash_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<SafetensorsFile> file_;
  // (layer, expert) -> its [gate_up_in, down_in] tensors
  std::map<std::pair<int64_t, int64_t>, std::pair<const HostTensor*, const HostTensor*>> matrices_;
  std::map<int64_t, std::vector<int32_t>> tokens_;  // MoE layer -> [experts]
  std::string hash_, path_;
};

}  // namespace moet
