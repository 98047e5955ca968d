// Routed experts as the engine stores them, chosen at load with `--experts`:
//   native  the checkpoint's values: BF16/F16/F32 as they are; FP8-block, NVFP4 and MXFP4
//           sources decoded exactly and kept as F32 (dense, for reference runs)
//   w2      moet's 2-bit sign-symmetric format (the default), requantized from any source
//   w2k     the stronger 2-bit format (formats/w2k.h: E8 lattice codebook, 2.25 bits a weight)
//   fp4     MXFP4, the FP4 tier format (MXFP4 sources keep their scales verbatim)
// W2-opt and W2K weigh their error by an importance matrix when one is given (io/imatrix.h); W2K
// with the LDLQ quantizer rounds against its inputs' second moments, its own or its layer's
// (io/ldlq_moments.h).
// For w2/w2k/fp4 every expert becomes one pack slot [codes13 | scales13 | codes2 | scales2]
// (io/pack_format.h), quantized at load or, with a pack directory, read from a pack file that
// is built on the first start and reused afterwards (stale packs are rebuilt, never used).
// A rank of a parallel model (ModelLoadOptions::shard) loads only its contiguous range of every
// layer's experts, and its pack is the rank's file (experts-<format>-rank<r>of<w>).
// The loader hands what it makes to an ExpertUploadSink (the model's weight loader implements
// it), so this module never calls back into models/.
#pragma once

#include "backend/backend.h"
#include "backend/communicator.h"
#include "core/random_bytes.h"
#include "core/thread_pool.h"
#include "formats/mx_block.h"
#include "io/checkpoint.h"
#include "io/imatrix.h"
#include "io/ldlq_moments.h"
#include "io/model_config.h"
#include "experts/fp4_tier.h"
#include "experts/residency.h"
#include "io/pack_reader.h"
#include "io/pack_source.h"
#include "io/pack_writer.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace moet {

enum class ExpertMode { native, w2, fp4, w2k };
ExpertMode expert_mode_parse(std::string_view name);  // "native" | "w2" | "w2k" | "fp4"
const char* expert_mode_name(ExpertMode mode);

struct ModelLoadOptions {
  ExpertMode experts = ExpertMode::w2;
  ZeroMode zero_mode = ZeroMode::automatic;
  W2Quantizer w2_quantizer = W2Quantizer::reference;
  std::shared_ptr<const Imatrix> imatrix;  // read by W2-opt and the reference W2K (null: uniform importance)
  W2kQuantizer w2k_quantizer = W2kQuantizer::reference;
  std::shared_ptr<const LdlqMoments> ldlq_moments;  // read by W2K's LDLQ quantizer
  std::filesystem::path pack_dir;  // empty: quantize at every load
  std::optional<TieringConfig> tiering;  // the backend as a cache of experts (w2 / fp4 only)
  std::optional<Fp4TierConfig> fp4_tier;  // the FP4 recovery tier over W2 experts
  double dummy_zipf = 0.0;  // invented models (model_load_random): routers skewed to Zipf(this); 0: uniform
  bool load_mtp = false;    // also load the MTP layer (models/mtp.h: --speculative-config mtp)
  ShardSpec shard;          // the rank of a parallel model this load is for (docs/parallel.md)
};

// Where the loader's tensors go: backend memory, counted as routed-expert bytes.
class ExpertUploadSink {
 public:
  virtual ~ExpertUploadSink() = default;
  // A quantized plane the loader built (U8 codes or scales), copied byte for byte.
  virtual Tensor upload_plane(const HostTensor& plane) = 0;
  // Native experts: checkpoint tensor `name` of `shape` as a dense weight (BF16/F32 as stored,
  // quantized sources decoded exactly to F32), and two of them stacked [2n, k] (gate and up).
  virtual Tensor dense(const std::string& name, const std::vector<int64_t>& shape) = 0;
  virtual Tensor dense_stacked(const std::string& a, const std::string& b, const std::vector<int64_t>& shape_each) = 0;
  // Checkpoint tensor `name` and its companions (scales) were consumed.
  virtual void mark_used(const std::string& name) = 0;
};

class ExpertLoader {
 public:
  // checkpoint null: invent random experts (benchmarks of full-size shapes).
  ExpertLoader(const Checkpoint* checkpoint, const ModelConfig& config, const ModelLoadOptions& options);
  ~ExpertLoader();
  // The format and shapes every expert this loader makes has.
  ExpertLayout layout() const;
  // The experts of every layer this rank holds: [expert_begin(), expert_end()).
  int64_t expert_begin() const { return options_.shard.begin(config_.n_routed_experts); }
  int64_t expert_end() const { return options_.shard.end(config_.n_routed_experts); }
  // The expert uploaded into backend memory.
  ExpertWeights load(ExpertUploadSink& sink, int64_t layer, int64_t expert);
  // W2 / W2K / FP4: where the planes sit in a row (a pack slot), and the row of (layer, expert) into
  // `row` (row_layout().bytes); both mark its checkpoint tensors used in `sink`, as mark_used()
  // does alone (for experts a pack store serves).
  ExpertRowLayout row_layout() const;
  void load_row(ExpertUploadSink& sink, int64_t layer, int64_t expert, uint8_t* row);
  void mark_used(ExpertUploadSink& sink, int64_t layer, int64_t expert) const;
  // With a pack directory: the pack (built or checked at construction) and what it must match.
  const std::optional<PackPaths>& pack_paths() const { return paths_; }
  const std::optional<PackSpec>& pack_spec() const { return spec_; }
  const Checkpoint* checkpoint() const { return checkpoint_; }

 private:
  static PackSpec random_pack_spec(const ModelConfig& config, StoreFormat format);
  ExpertWeights from_slot(ExpertUploadSink& sink, const uint8_t* slot, const std::string& name) const;
  // slot_ = the expert's slot (from the pack, quantized, or invented).
  void fill_slot(ExpertUploadSink& sink, int64_t layer, int64_t expert);
  void fill_random(uint8_t* slot);
  ExpertSourceFn expert_sources() const;
  PackQuantizer pack_quantizer() const;

  const Checkpoint* checkpoint_;
  const ModelConfig& config_;
  ModelLoadOptions options_;
  ThreadPool pool_;
  std::optional<PackSpec> spec_;           // w2 / w2k / fp4
  std::optional<PackPaths> paths_;         // with a pack directory
  std::unique_ptr<PackReader> reader_;     // with a pack directory
  std::unique_ptr<LdlqFactors> ldlq_;     // W2K's LDLQ: its layers' decompositions
  std::vector<uint8_t> slot_;
  RandomBytes random_{0x9e3779b97f4a7c15ull};
};

}  // namespace moet
