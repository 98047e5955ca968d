// A model split over several nodes (docs/parallel.md, "Several nodes"): node 0 runs the engine and
// the HTTP front end; every other node loads its ranks' part of the model and then only follows.
// Node 0's split model (models/parallel_model.h) tells the other nodes each call that reaches its
// ranks, over the links the rendezvous left open (backend/rendezvous.h), before its own ranks run
// it: a KV cache made (the same specs, blocks and block size: their caches are known by an id) or
// released, and each forward's batch (tokens, positions, slots, the block tables' entries the
// step reads, the rows asked for, the graph key). Every node's ranks then run the same forward and
// meet in the same collectives. Messages are the nodes' own binary layout: every node runs the
// same moet build. A failed step on a model over several nodes is not recovered from (restart).
#pragma once

#include "backend/rendezvous.h"
#include "models/model.h"

#include <map>
#include <mutex>
#include <span>
#include <vector>

namespace moet {

class RemoteNodes {
 public:
  // The links of nodes 1, 2, ... (node 0's side of the rendezvous).
  explicit RemoteNodes(std::vector<NodeLink> links);
  // Tells the nodes to stop following (their commands then return).
  ~RemoteNodes();
  RemoteNodes(const RemoteNodes&) = delete;
  RemoteNodes& operator=(const RemoteNodes&) = delete;

  // The other nodes make the same cache; returns the id they know it by.
  int64_t create_cache(std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size);
  void destroy_cache(int64_t id);
  void forward(int64_t cache, const ForwardBatch& batch);

 private:
  void send(const std::vector<uint8_t>& message);

  std::vector<NodeLink> links_;
  std::mutex mutex_;
  int64_t next_id_ = 1;
  std::map<int64_t, int64_t> block_size_;  // per cache id
};

// A node other than 0: runs what node 0 sends on `model` (this node's ranks) until node 0 stops or
// its link closes.
void follow_node0(Model& model, NodeLink& node0);

}  // namespace moet
