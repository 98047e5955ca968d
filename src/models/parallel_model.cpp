// ParallelModel: a Model over the local ranks of a CommGroup (see parallel_model.h).
#include "models/parallel_model.h"

#include "core/error.h"
#include "core/log.h"
#include "core/rank_threads.h"
#include "models/blocks.h"
#include "models/remote_nodes.h"

namespace moet {
namespace {

struct Rank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;
};

class ParallelModel final : public Model {
 public:
  ParallelModel(CommGroup& group, std::shared_ptr<RemoteNodes> remote)
      : group_(group), remote_(std::move(remote)), threads_(group.local_size()), ranks_(size_t(group.local_size())) {}

  ~ParallelModel() override {
    // Each rank's model and backend go on the rank's thread (a GPU rank's device is bound there).
    try {
      threads_.run([&](int r) {
        Rank& rank = ranks_[size_t(r)];
        rank.model.reset();
        rank.comm.reset();
        rank.backend.reset();
      });
    } catch (const std::exception& e) {
      MOET_LOG_WARN("releasing a parallel model: {}", e.what());
    }
  }

  void load(const ParallelLoad& load, const ModelLoadOptions& options) {
    run([&](int r) {
      Rank& rank = ranks_[size_t(r)];
      rank.backend = load.backend(r);
      rank.comm = group_.connect(r, *rank.backend);
      ModelLoadOptions own = options;
      own.shard = {group_.first_rank() + r, group_.size(), load.expert_parallel, rank.comm.get()};
      rank.model = load.model(*rank.backend, own);
    });
    MOET_LOG_INFO("{} ranks: rank 0 on {}, collectives over {}", group_.size(), ranks_[0].backend->name(),
                  ranks_[0].comm->name());
  }

  const ModelConfig& config() const override { return first().config(); }
  Backend& backend() override { return *ranks_[0].backend; }
  const std::vector<KvLayerSpec>& kv_layer_specs() const override { return first().kv_layer_specs(); }
  void set_kv_cache_dtype(KvDtype dtype) override {
    for (Rank& rank : ranks_) rank.model->set_kv_cache_dtype(dtype);
  }
  ExpertPool& experts() override { return ranks_[0].model->experts(); }
  void for_each_backend(const std::function<void(Backend&)>& fn) {
    run([&](int r) { fn(*ranks_[size_t(r)].backend); });
  }
  bool has_mtp() const override { return false; }

  KvCache kv_cache_create(std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size) override {
    std::vector<KvCache> caches(ranks_.size());
    run([&](int r) { caches[size_t(r)] = ranks_[size_t(r)].model->kv_cache_create(specs, blocks, block_size); });
    KvCache cache = std::move(caches[0]);
    cache.ranks.assign(std::make_move_iterator(caches.begin() + 1), std::make_move_iterator(caches.end()));
    if (remote_) {
      const int64_t id = remote_->create_cache(specs, blocks, block_size);
      cache.remote = std::shared_ptr<const int64_t>(new int64_t(id), [remote = remote_](const int64_t* p) {
        try {
          remote->destroy_cache(*p);
        } catch (const std::exception& e) {
          MOET_LOG_WARN("releasing a KV cache on the other nodes: {}", e.what());
        }
        delete p;
      });
    }
    return cache;
  }

  StepOutput forward(const ForwardBatch& batch, KvCache& cache) override {
    MOET_CHECK(cache.ranks.size() + 1 == ranks_.size(), "forward: a KV cache for {} ranks on a model of {}",
               cache.ranks.size() + 1, ranks_.size());
    if (remote_) {
      MOET_CHECK(cache.remote != nullptr, "forward: a KV cache the other nodes do not know");
      remote_->forward(*cache.remote, batch);
    }
    StepOutput output;
    run([&](int r) {
      KvCache& own = r == 0 ? cache : cache.ranks[size_t(r - 1)];
      StepOutput out = ranks_[size_t(r)].model->forward(batch, own);
      if (r == 0) output = std::move(out);
    });
    return output;
  }

 private:
  const Model& first() const { return *ranks_[0].model; }

  // body(r) on every rank's thread; a failure aborts the group's collectives and is rethrown.
  void run(const std::function<void(int)>& body) {
    MOET_CHECK(!broken_, "this parallel model's communicators cannot recover from an earlier failed step; restart it");
    try {
      threads_.run(body, [this](const std::string& why) { group_.abort(why); });
    } catch (...) {
      broken_ = !group_.reset() || remote_ != nullptr;  // other nodes' ranks may still wait
      throw;
    }
  }

  CommGroup& group_;
  std::shared_ptr<RemoteNodes> remote_;
  RankThreads threads_;
  std::vector<Rank> ranks_;
  bool broken_ = false;
};

}  // namespace

void parallel_check(const ModelConfig& c, const ParallelConfig& parallel) {
  const int n = parallel.tensor_parallel_size;
  MOET_CHECK(n >= 1, "--tensor-parallel-size must be at least 1 (got {})", n);
  MOET_CHECK(!parallel.expert_parallel || n > 1,
             "--enable-expert-parallel partitions the experts over the --tensor-parallel-size ranks: give a size of "
             "2 or more");
  if (n == 1) return;
  MOET_CHECK(c.n_routed_experts == 0 || n <= c.n_routed_experts,
             "--tensor-parallel-size {} exceeds the {} routed experts of {} (each rank holds a part of them)", n,
             c.n_routed_experts, c.family);
  MOET_CHECK(n <= c.vocab_size, "--tensor-parallel-size {} exceeds the vocabulary of {}", n, c.vocab_size);
  const ShardSpec shard{0, n};
  if (c.mla || c.o_groups > 0) {
    MOET_CHECK(c.num_attention_heads % n == 0, "--tensor-parallel-size {}: the {} attention heads are not divisible "
               "by it", n, c.num_attention_heads);
    if (c.o_groups > 0) {
      const int64_t heads = c.num_attention_heads / n, group = c.num_attention_heads / c.o_groups;
      MOET_CHECK(heads % group == 0 || group % heads == 0,
                 "--tensor-parallel-size {}: the {} attention heads in {} output groups cannot be split", n,
                 c.num_attention_heads, c.o_groups);
    }
  } else {
    gqa_heads(c, shard);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    MOET_CHECK(c.layer_is_moe[size_t(l)] || c.intermediate_size >= n,
               "--tensor-parallel-size {} exceeds the {} intermediate columns of the dense MLP", n,
               c.intermediate_size);
  MOET_CHECK(c.n_shared_experts == 0 || c.n_shared_experts * c.moe_intermediate_size >= n,
             "--tensor-parallel-size {} exceeds the {} intermediate columns of the shared experts", n,
             c.n_shared_experts * c.moe_intermediate_size);
}

void parallel_check(const ModelLoadOptions& options, const ParallelConfig& parallel) {
  if (!parallel.parallel()) return;
  const int n = parallel.tensor_parallel_size;
  MOET_CHECK(!options.tiering, "--tensor-parallel-size {}: the expert cache (--expert-cache-gb) does not run on a "
             "split model yet; keep every expert resident", n);
  MOET_CHECK(!options.fp4_tier, "--tensor-parallel-size {}: the FP4 tier (--fp4-pool-gb / --fp4-pool-slots) does not "
             "run on a split model yet", n);
  MOET_CHECK(!options.load_mtp, "--tensor-parallel-size {}: MTP speculative decoding does not run on a split model "
             "yet; use --speculative-config method ngram", n);
}

void for_each_rank_backend(Model& model, const std::function<void(Backend&)>& fn) {
  if (auto* split = dynamic_cast<ParallelModel*>(&model)) return split->for_each_backend(fn);
  fn(model.backend());
}

std::unique_ptr<Model> parallel_model_load(const ModelConfig& config, const ParallelLoad& load,
                                           const ModelLoadOptions& options) {
  MOET_CHECK(load.group != nullptr && load.backend && load.model, "parallel_model_load: incomplete ParallelLoad");
  const ParallelConfig parallel{load.group->size(), load.expert_parallel};
  parallel_check(config, parallel);
  parallel_check(options, parallel);
  auto model = std::make_unique<ParallelModel>(*load.group, load.remote);
  model->load(load, options);
  return model;
}

}  // namespace moet
