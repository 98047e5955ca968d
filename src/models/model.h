// What the engine sees of a model: a forward over a batch of tokens from any number of sequences
// (prefill rows and decode rows alike) that writes their K/V into a paged cache and returns, for
// the rows asked for, their logits (whole, or only the best few of each row: computed where the
// logits are, so a GPU copies k candidates per row instead of the vocabulary) and their last
// hidden state (what MTP drafting reads). A model loaded with its MTP layer (models/mtp.h) runs
// that layer instead of the decoder stack for a batch that says so (draft steps of speculative
// decoding). Only the step runner (engine/step_runner.h) calls forward(). A model declares what
// each layer keeps in the KV cache (kv_layer_specs(); kv/ allocates it) and owns its routed
// experts (experts(), an ExpertPool). Built from a checkpoint by model_load() (registry.cpp),
// which dispatches on the config's family to one file per architecture (models/arch/).
#pragma once

#include "backend/backend.h"
#include "experts/expert_loader.h"
#include "experts/expert_pool.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "kv/kv_cache.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace moet {

struct ForwardBatch {
  std::vector<int32_t> tokens;                // [rows]
  std::vector<int32_t> positions;             // [rows] position in its sequence
  std::vector<int32_t> row_seq;               // [rows] index into block_tables
  std::vector<int64_t> slots;                 // [rows] physical KV slot the row writes
  std::vector<const int32_t*> block_tables;   // [sequences]
  std::vector<int32_t> logit_rows;            // rows whose logits are returned, in this order
  // > 0: only the best top_k logits of each logit row (1 <= top_k <= min(vocab, kMaxTopLogits)).
  int64_t top_k = 0;
  std::vector<int32_t> hidden_rows;           // rows whose last hidden state is returned, in this order
  // Indices into logit_rows whose confidence (the gate's signals, kernels/cpu/logit_confidence.h)
  // is returned, computed from the whole rows where they are (top_k only returns the best few).
  std::vector<int32_t> confidence_rows;
  // Set for a step whose shape recurs (a decode step): the forward runs through
  // Backend::run_graph under this key (a CUDA graph per key and step layout), which must name
  // everything the forward bakes into its launches besides the step inputs (the step runner
  // builds it). Null: eager. Results are the same either way.
  const GraphKey* graph = nullptr;
  // A decode-like step (StepInputs::row_invariant): each row's results must not depend on the
  // other rows of the step (the step runner sets it; engine/step_runner.h says when).
  bool row_invariant = false;
  // Set for a draft step: the rows run the model's MTP layer instead of the decoder stack. Each
  // row's token is the one after the row's position, and mtp_hidden [rows, hidden] holds each
  // row's hidden state after the final norm (the target model's at that position, or the MTP
  // layer's own output when drafts are chained). Logits and hidden rows are the MTP layer's.
  const std::vector<float>* mtp_hidden = nullptr;
};

// The k best logits of each row asked for and their token ids, best first (the order of
// kernels/cpu/top_logits.h: ties to the lower id, NaN last).
struct TopLogits {
  int64_t k = 0;
  std::vector<float> values;  // [rows, k]
  std::vector<int32_t> ids;   // [rows, k]
};

// One forward's results in host memory.
struct StepOutput {
  std::vector<float> logits;  // [logit_rows, vocab] when top_k == 0
  TopLogits top;              // [logit_rows, top_k] when top_k > 0
  // [hidden_rows, hidden_size]: each row's hidden state after the final norm (the LM head's input).
  std::vector<float> hidden;
  // [confidence_rows, 2]: each row's largest softmax probability and its margin over the second.
  std::vector<float> confidence;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Backend& backend() = 0;
  // What each layer keeps per token in the KV cache (kv_cache_create() allocates it).
  virtual const std::vector<KvLayerSpec>& kv_layer_specs() const = 0;
  // Every layer's KV cache is stored as `dtype` from now on (F32 after load; caches made before
  // keep theirs). Fails with a one-line error naming --kv-cache-dtype where a layer cannot
  // (nvfp4 for GQA). The edge (cli/) calls it once after load, before any engine or runner exists.
  virtual void set_kv_cache_dtype(KvDtype dtype) = 0;
  // The routed experts of every MoE layer.
  virtual ExpertPool& experts() = 0;
  // Whether the MTP layer was loaded (ModelLoadOptions::load_mtp); its KV spec is the last.
  virtual bool has_mtp() const = 0;
  // A KV cache of `specs` (the model's, or the same layers in another dtype) with `blocks` blocks
  // of `block_size` slots, zeroed, for forward(): in backend() memory (a model split over ranks:
  // every rank's, KvCache::ranks).
  virtual KvCache kv_cache_create(std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size) {
    return moet::kv_cache_create(backend(), specs, blocks, block_size);
  }
  virtual StepOutput forward(const ForwardBatch& batch, KvCache& cache) = 0;
};

// Every layer's KV spec of a model of `config` stored as `dtype`, without loading it (the same
// specs model_load() gives, less a checkpoint's fp8 scales).
std::vector<KvLayerSpec> kv_layer_specs_for(const ModelConfig& config, KvDtype dtype);

struct LoadStats;
// Routed experts are stored as options.experts says (w2 unless told; see experts/expert_loader.h).
std::unique_ptr<Model> model_load(const Checkpoint& checkpoint, Backend& backend, LoadStats* stats = nullptr,
                                  const ModelLoadOptions& options = {});
// A model of the shapes `config` describes with invented weights (benchmarks, --load-format dummy).
std::unique_ptr<Model> model_load_random(const nlohmann::json& config, Backend& backend, uint64_t seed,
                                         LoadStats* stats = nullptr, const ModelLoadOptions& options = {});

}  // namespace moet
