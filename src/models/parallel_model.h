// A model split over ranks that are threads of this process (docs/parallel.md): each rank has its
// own backend (a CPU backend, or one GPU), communicator and DecoderModel holding its part of the
// weights (WeightLoader parts, ShardSpec), and its own KV cache (KvCache::ranks). forward() runs the
// same batch on every rank at once, each on its own persistent thread (RankThreads), and returns
// rank 0's output; the ranks' collectives make every rank's residual stream and logits the same
// bits, so routing, which every rank computes for itself, agrees. A rank that fails aborts the
// group's collectives so the others return, and the error reaches the caller; a CPU group is then
// usable again (the next step runs), an NCCL one is not (the model then refuses every step), nor is
// a model split over nodes. On node 0 of several (ParallelLoad::remote) every KV cache and forward
// is told to the other nodes before the local ranks run it (models/remote_nodes.h).
// The engine sees one Model: its config, rank 0's backend, KV specs (one rank's share) and experts.
#pragma once

#include "backend/communicator.h"
#include "models/model.h"

#include <functional>
#include <memory>

namespace moet {

// How `--tensor-parallel-size` and `--enable-expert-parallel` split a model (the CLI's options).
struct ParallelConfig {
  int tensor_parallel_size = 1;
  bool expert_parallel = false;

  bool parallel() const { return tensor_parallel_size > 1; }
};

// Fails with a one-line error naming the flag when `config` cannot be split as `parallel` says:
// heads (GQA: divisible by N, KV heads divisible by N or dividing it; MLA: divisible; DeepSeek-V4:
// and its output groups), more ranks than routed experts, the vocabulary or an MLP narrower than N.
void parallel_check(const ModelConfig& config, const ParallelConfig& parallel);
// The same for what the load options ask beside it (the expert cache, the FP4 tier, MTP).
void parallel_check(const ModelLoadOptions& options, const ParallelConfig& parallel);

class RemoteNodes;

struct ParallelLoad {
  CommGroup* group = nullptr;  // the model's ranks are the group's local ranks
  bool expert_parallel = false;
  // Local rank `local`'s backend, made on the rank's thread.
  std::function<std::unique_ptr<Backend>(int local)> backend;
  // A rank's model over its backend (options.shard names the rank), on the rank's thread.
  std::function<std::unique_ptr<Model>(Backend&, const ModelLoadOptions&)> model;
  // Node 0 of a model split over nodes: the other nodes, told every KV cache and forward first.
  std::shared_ptr<RemoteNodes> remote;
};

// Loads every local rank's part of the model at once (one thread per rank); `config` is checked
// with parallel_check() first.
std::unique_ptr<Model> parallel_model_load(const ModelConfig& config, const ParallelLoad& load,
                                           const ModelLoadOptions& options);

// fn(backend) for every rank's backend of a split model (each on its rank's thread), or for
// model.backend() of another model: the settings a benchmark changes on every rank (CUDA graphs).
void for_each_rank_backend(Model& model, const std::function<void(Backend&)>& fn);

}  // namespace moet
