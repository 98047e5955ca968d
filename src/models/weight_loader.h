// Reads a model's weights into backend memory, checking each tensor's shape against what the
// config implies (errors name the tensor and both shapes), and remembering which tensors were
// used so that the rest can be reported (unused ones, such as the MTP layer at index
// num_hidden_layers when it is not loaded, are skipped with a debug log). Weights that only Backend::matmul reads
// (matmul_weight / matmul_stacked: attention projections, dense MLPs, shared experts) stored as
// FP8 with 128x128 block scales stay FP8 (tensor.h), a quarter of their F32 decode; every other
// quantized weight (FP8 for ops that take no FP8: MLA's per-head kv_b_proj, embeddings, LM heads;
// NVFP4, MXFP4) is decoded exactly to F32 at load. Routed experts are made by the ExpertLoader
// (experts/, --experts native|w2|fp4), which uploads through this loader as its ExpertUploadSink.
// A loader made by random() instead invents every tensor (BF16,
// N(0, 0.02); norm weights 1), and with fp8_dense the matmul weights as FP8-block codes of such
// values over a fixed scale, for benchmarks of full-size shapes without files.
// A rank of a tensor-parallel model (shard(): docs/parallel.md) asks for a WeightPart of a weight:
// its rows are a view of the checkpoint's mapping, its columns are gathered row by row, so the
// rank reads only its part (bytes_read counts what was read, per tensor); FP8-block parts stay
// FP8 where their edges fall on 128-blocks (or inside one block), and quantized tensors that are
// decoded at load are decoded whole first (read whole, and counted so).
#pragma once

#include "backend/backend.h"
#include "backend/communicator.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "experts/expert_loader.h"

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace moet {

// A rectangle of a 2-D weight given by its full shape (a 1-D weight: rows only): rows [row_begin,
// row_end) and columns [col_begin, col_end), an end of -1 meaning the full extent. The default is
// the whole weight.
struct WeightPart {
  int64_t row_begin = 0, row_end = -1, col_begin = 0, col_end = -1;

  static WeightPart rows(int64_t begin, int64_t end) { return {begin, end, 0, -1}; }
  static WeightPart cols(int64_t begin, int64_t end) { return {0, -1, begin, end}; }
  bool whole() const { return row_begin == 0 && row_end < 0 && col_begin == 0 && col_end < 0; }
};

struct LoadStats {
  uint64_t bytes = 0;          // all weights uploaded
  uint64_t routed_bytes = 0;   // routed experts
  uint64_t embedding_bytes = 0;
  uint64_t mtp_bytes = 0;         // of `bytes`, the MTP layer's (not read by a decode step)
  uint64_t mtp_routed_bytes = 0;  // of those, its routed experts (also in routed_bytes)
  // Checkpoint bytes read through the loader (codes and block scales; a decoded tensor whole), in
  // all and per tensor: a rank of a sharded model reads its parts only.
  uint64_t bytes_read = 0;
  std::map<std::string, uint64_t> read_by_tensor;
};

class WeightLoader final : public ExpertUploadSink {
 public:
  WeightLoader(const Checkpoint& checkpoint, Backend& backend) : checkpoint_(&checkpoint), backend_(backend) {}
  // zipf > 0: router_bias() skews the invented routers so expert popularity follows Zipf(zipf).
  static WeightLoader random(Backend& backend, uint64_t seed, bool fp8_dense = false, double zipf = 0.0);
  const Checkpoint* checkpoint() const { return checkpoint_; }
  // True when `name` is stored as BF16/F16/F32 (or invented): loadable without decoding.
  bool is_plain_float(const std::string& name) const;

  // ExpertUploadSink: quantized expert planes, native experts (weight() / stacked()), and
  // mark_used() of `name` and its companions (X.weight_scale_inv, X.weight_scale, ... for X.weight).
  Tensor upload_plane(const HostTensor& plane) override { return counted(plane.name, backend_.upload(plane)); }
  Tensor dense(const std::string& name, const std::vector<int64_t>& shape) override { return weight(name, shape); }
  Tensor dense_stacked(const std::string& a, const std::string& b, const std::vector<int64_t>& shape_each) override {
    return stacked(a, b, shape_each);
  }
  void mark_used(const std::string& name) override;

  // The rank this loader loads for (whole weights unless a block asks for its part).
  void set_shard(const ShardSpec& shard) { shard_ = shard; }
  const ShardSpec& shard() const { return shard_; }

  // `shape` is always the full shape (checked against the checkpoint); the result has the part's.
  const HostTensor& info(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part = {});
  bool has(const std::string& name) const;
  Tensor weight(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part = {});
  Tensor weight_f32(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part = {});
  // Two [n, k] weights stacked into one [2n, k] (gate and up projections; the part of each).
  Tensor stacked(const std::string& a, const std::string& b, const std::vector<int64_t>& shape_each,
                 const WeightPart& part = {});
  // A weight read only by Backend::matmul / matmul_group: FP8-block tensors (128x128 blocks) stay
  // FP8 with F32 block scales; any other as weight().
  Tensor matmul_weight(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part = {});
  // Two of them stacked as stacked(); FP8 stays FP8 when each part's rows are a multiple of 128
  // (the halves' scale blocks then stack too), else both are decoded to F32.
  Tensor matmul_stacked(const std::string& a, const std::string& b, const std::vector<int64_t>& shape_each,
                        const WeightPart& part = {});
  // Invented models routed by Zipf (--dummy-routing zipf:S): a bias of -S ln(rank + 1) on the
  // router logits of `layer`, ranks a fixed permutation of the experts per layer; else empty.
  Tensor router_bias(int64_t layer, int64_t experts);
  // Counts everything uploaded since `before` as the MTP layer's.
  void count_as_mtp(const LoadStats& before) {
    stats_.mtp_bytes = stats_.bytes - before.bytes;
    stats_.mtp_routed_bytes = stats_.routed_bytes - before.routed_bytes;
  }
  // Logs the checkpoint tensors never read; returns how many there were.
  size_t report_unused() const;
  Backend& backend() { return backend_; }
  const LoadStats& stats() const { return stats_; }

 private:
  // An FP8-block weight in host memory: its codes (checkpoint mapping or invented) and F32 scales.
  struct Fp8Host {
    const HostTensor* codes;
    std::vector<float> scales;
  };

  WeightLoader(Backend& backend, uint64_t seed, bool fp8_dense, double zipf)
      : checkpoint_(nullptr), backend_(backend), rng_(seed), fp8_dense_(fp8_dense), zipf_(zipf) {}
  const HostTensor& invent(const std::string& name, const std::vector<int64_t>& shape);
  // Invented values of `name` (see invent()) stored through encode(float) -> T, kept alive.
  template <typename T, typename Encode>
  const HostTensor& invent_as(const std::string& name, const std::vector<int64_t>& shape, DType dtype, Encode encode);
  // Whether `name` is FP8 with 128x128 block scales (invented so under fp8_dense) and `part` of it
  // can keep them (its edges on block edges, or inside one block).
  bool keeps_fp8(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part) const;
  Fp8Host fp8_host(const std::string& name, const std::vector<int64_t>& shape, const WeightPart& part);
  // `part` of `whole` (a full tensor in host memory): a view for rows, a gathered copy (kept alive
  // like invented ones) for columns; `read` counts the bytes read from the checkpoint.
  const HostTensor& part_of(const HostTensor& whole, const WeightPart& part, bool read);
  void count_read(const std::string& name, uint64_t bytes);
  // Uploads FP8 codes already in backend memory (a U8 plane) with their scales.
  Tensor fp8_upload(const std::string& name, Tensor codes, const std::vector<float>& scales);
  // Keeps `bytes` alive as the last of invented_ (the four newest stay: a stacked pair of
  // decoded tensors and their parts) and returns its info.
  const HostTensor& keep(HostTensor info, std::unique_ptr<uint8_t[]> bytes);
  Tensor counted(const std::string& name, Tensor tensor);
  // A quantized checkpoint tensor decoded exactly to F32 (kept alive like invented ones).
  const HostTensor& decoded(const std::string& name, const std::vector<int64_t>& shape);

  const Checkpoint* checkpoint_;  // null for random weights
  Backend& backend_;
  std::set<std::string> used_;
  LoadStats stats_;
  std::mt19937_64 rng_;
  bool fp8_dense_ = false;  // random loaders only
  double zipf_ = 0.0;       // random loaders only
  ShardSpec shard_;
  std::deque<std::pair<HostTensor, std::unique_ptr<uint8_t[]>>> invented_;  // the last four, kept alive
  std::deque<HostTensor> views_;  // row parts of checkpoint tensors (the last four)
  std::unique_ptr<ThreadPool> pool_;  // invents on every core; made on first use
};

}  // namespace moet
