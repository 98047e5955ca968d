// The flags of a model split over ranks (docs/parallel.md): --tensor-parallel-size N and
// --enable-expert-parallel (vLLM's names), and across nodes --nnodes, --node-rank, --master-addr,
// --master-port (torchrun's names), each with a MOET_* environment fallback; and the communicator
// group they make: the CPU's ranks are threads of this process (CpuCommGroup); on CUDA, NCCL over
// one GPU per rank, bootstrapped from a unique id that node 0 hands out (backend/rendezvous.h).
#pragma once

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/rendezvous.h"
#include "models/parallel_model.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

namespace moet::cli {

struct DeviceOptions;

struct ParallelOptions {
  int tensor_parallel_size = 1;
  bool enable_expert_parallel = false;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  void add_to(CLI::App& sub);
  ParallelConfig config() const { return {tensor_parallel_size, enable_expert_parallel}; }
  // Whether the model is split at all (over ranks of this process or over nodes).
  bool split() const { return tensor_parallel_size > 1 || nnodes > 1 || enable_expert_parallel; }
};

// The one gate of a split model on --device cuda (NCCL): fails with one line until the CUDA tests
// of the split forward (tests/cpp/cuda/cuda_parallel_test.cpp) and tools/gpu/parallel.sh have run
// on GPUs; remove it then. Called before any device is opened.
void parallel_device_gate(const DeviceOptions& device, const ParallelOptions& parallel);

// This process's ranks and their communicators for `device` (checked against the flags: the ranks
// per node, the CPU on one node), and over several nodes the rendezvous' links: on node 0 to every
// other node (RemoteNodes), on the others to node 0 (follow_node0).
struct NodeGroup {
  std::unique_ptr<CommGroup> group;
  std::vector<NodeLink> links;
};
NodeGroup comm_group_create(const DeviceOptions& device, const ParallelOptions& parallel,
                            const std::string& description);

// The backend of local rank `local` of a split model: CPU ranks share --threads (at least one
// thread each), CUDA rank l takes GPU l.
std::unique_ptr<Backend> rank_backend_create(const DeviceOptions& device, const ParallelOptions& parallel, int local);

}  // namespace moet::cli
