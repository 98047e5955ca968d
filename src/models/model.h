// What the engine sees of a model: a forward over a batch of tokens from any number of sequences
// (prefill rows and decode rows alike) that writes their K/V into a paged cache and returns the
// logits of the rows asked for, whole or only the best few of each row (forward_top: computed
// where the logits are, so a GPU copies k candidates per row instead of the vocabulary). Built from a checkpoint by model_load() (registry.cpp), which
// dispatches on the config's family to one file per architecture.
#pragma once

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/expert_loader.h"

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
  // Every row is one sequence's next decode token: a step whose shape recurs, which the model
  // runs through Backend::run_graph (a CUDA graph per batch size and context bucket). Prefill and
  // mixed steps leave it false and run eagerly. Results are the same either way.
  bool decode = false;
};

// The k best logits of each row asked for and their token ids, best first (the order of
// kernels/cpu/top_logits.h: ties to the lower id, NaN last).
struct TopLogits {
  int64_t k = 0;
  std::vector<float> values;  // [rows, k]
  std::vector<int32_t> ids;   // [rows, k]
};

struct KvCache {
  int64_t blocks = 0;
  int64_t block_size = 0;
  std::vector<KvLayerCache> layers;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCache create_kv_cache(int64_t blocks, int64_t block_size) = 0;
  // Bytes one token occupies in the KV cache over all layers.
  virtual int64_t kv_bytes_per_token() const = 0;
  // Returns logits [batch.logit_rows.size(), vocab] on the host.
  virtual std::vector<float> forward(const ForwardBatch& batch, KvCache& cache) = 0;
  // The same forward, returning only the k best logits of each of those rows (1 <= k <=
  // min(vocab, kMaxTopLogits)); exactly the best k of what forward() returns.
  virtual TopLogits forward_top(const ForwardBatch& batch, KvCache& cache, int64_t k) = 0;
};

struct LoadStats;
// Routed experts are stored as options.experts says (w2 unless told; see expert_loader.h).
std::unique_ptr<Model> model_load(const Checkpoint& checkpoint, Backend& backend, LoadStats* stats = nullptr,
                                  const ModelLoadOptions& options = {});
// A model of the shapes `config` describes with invented weights (benchmarks, --load-format dummy).
std::unique_ptr<Model> model_load_random(const nlohmann::json& config, Backend& backend, uint64_t seed,
                                         LoadStats* stats = nullptr, const ModelLoadOptions& options = {});

}  // namespace moet
