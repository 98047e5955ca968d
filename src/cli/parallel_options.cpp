// Flags and communicator groups of split models (see parallel_options.h).
#include "cli/parallel_options.h"

#include "cli/model_options.h"

#include "backend/cpu/cpu_communicator.h"
#include "backend/rendezvous.h"
#include "core/error.h"
#ifdef MOET_HAVE_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif

#include <algorithm>
#include <thread>

namespace moet::cli {

void ParallelOptions::add_to(CLI::App& sub) {
  sub.add_option("--tensor-parallel-size", tensor_parallel_size,
                 "split the model over this many ranks (CPU: threads of this process; CUDA: one GPU each): "
                 "attention heads, MLP columns, vocabulary and routed experts; docs/parallel.md")
      ->envname("MOET_TENSOR_PARALLEL_SIZE")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_flag("--enable-expert-parallel", enable_expert_parallel,
               "with --tensor-parallel-size N: routed rows go to the ranks of their experts by all-to-all "
               "(dispatch and combine) instead of every rank's experts running over every row")
      ->envname("MOET_ENABLE_EXPERT_PARALLEL");
  sub.add_option("--nnodes", nnodes, "nodes the --tensor-parallel-size ranks span (CUDA: one process per node)")
      ->envname("MOET_NNODES")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_option("--node-rank", node_rank,
                 "this node's index in [0, --nnodes); node 0 runs the engine and serves HTTP, the others follow "
                 "its steps")
      ->envname("MOET_NODE_RANK")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--master-addr", master_addr, "address of node 0, where the other nodes join (TCP rendezvous)")
      ->envname("MOET_MASTER_ADDR")
      ->capture_default_str();
  sub.add_option("--master-port", master_port, "TCP port of the rendezvous on node 0")
      ->envname("MOET_MASTER_PORT")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
}

void parallel_device_gate(const DeviceOptions& device, const ParallelOptions& parallel) {
  if (!device.refuses_unverified() || !parallel.split()) return;
  fail("--tensor-parallel-size / --enable-expert-parallel / --nnodes on --device cuda is not yet verified on a GPU "
       "(tools/gpu/parallel.sh); use --device cpu");
}

NodeGroup comm_group_create(const DeviceOptions& device, const ParallelOptions& p, const std::string& description) {
  const int size = p.tensor_parallel_size;
  MOET_CHECK(p.nnodes >= 1 && p.node_rank < p.nnodes, "--node-rank {} outside [0, --nnodes {})", p.node_rank,
             p.nnodes);
  MOET_CHECK(size % p.nnodes == 0, "--tensor-parallel-size {} is not a multiple of --nnodes {} (every node holds as "
             "many ranks)", size, p.nnodes);
  if (device.device == "cpu") {
    MOET_CHECK(p.nnodes == 1, "--nnodes {} needs --device cuda: the CPU's ranks are threads of one process",
               p.nnodes);
    return {std::make_unique<CpuCommGroup>(size), {}};
  }
#ifdef MOET_HAVE_NCCL
  const int local = size / p.nnodes;
  NcclId id{};
  if (p.node_rank == 0) id = nccl_unique_id();
  RendezvousResult met = rendezvous({p.nnodes, p.node_rank, p.master_addr, p.master_port}, description, id);
  MOET_CHECK(met.payload.size() == id.size(), "rendezvous: node 0 sent {} bytes, not an NCCL id", met.payload.size());
  std::copy(met.payload.begin(), met.payload.end(), id.begin());
  return {nccl_comm_group_create(id, size, p.node_rank * local, local), std::move(met.links)};
#else
  (void)description;
  fail("--tensor-parallel-size on --device {}: this moet was built without NCCL (nccl.h was not found at configure "
       "time)", device.device);
#endif
}

std::unique_ptr<Backend> rank_backend_create(const DeviceOptions& device, const ParallelOptions& parallel, int local) {
  DeviceOptions own = device;
  const int local_ranks = parallel.tensor_parallel_size / parallel.nnodes;
  if (device.device == "cpu") {
    const int threads = device.threads > 0 ? device.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    own.threads = std::max(1, threads / local_ranks);
  }
  return backend_create(own, local);
}

}  // namespace moet::cli
