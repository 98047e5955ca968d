// Collectives between the ranks of a tensor- or expert-parallel model (docs/parallel.md). Each rank
// holds one Communicator bound to its backend: the tensors are that backend's memory, and on a GPU
// the operations are enqueued on the backend's stream (NCCL, backend/cuda/nccl_communicator.h), so
// they order with the ops around them and a captured graph holds them. The CPU implementation
// (backend/cpu/cpu_communicator.h) connects several ranks inside one process through shared memory.
// Every rank must call the same operations in the same order with tensors of the same shape and
// dtype. Sums are F32 and reach every rank with the same bits: the CPU adds the ranks' values in
// rank order (0, 1, ..., size - 1) whatever the threads' timing; NCCL computes each element once and
// copies it (ring / tree), deterministic run to run for a fixed configuration.
#pragma once

#include "backend/tensor.h"

#include <memory>
#include <string>

namespace moet {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // x = the sum of every rank's x (F32, in place).
  virtual void all_reduce(Tensor& x) = 0;
  // out [size * n elements] = every rank's in [n elements], rank after rank (any dtype).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // out [n elements] = part `rank` of the sum of every rank's in [size * n elements] (F32).
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in and out [size * n elements] (any dtype): part d of in goes to rank d, and part s of out
  // comes from rank s.
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  // x = root's x (any dtype, in place).
  virtual void broadcast(Tensor& x, int root) = 0;
  // Returns once every rank has reached it and everything enqueued before it on every rank is done.
  virtual void barrier() = 0;
};

class Backend;

// The ranks of a parallel model that run in this process, and how their communicators are made:
// the CPU's threads over shared memory (backend/cpu/cpu_communicator.h) or NCCL, within a node or
// across nodes (backend/cuda/nccl_communicator.h). Local rank l is global rank first_rank() + l of
// size() (every node's ranks together).
class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int size() const = 0;
  virtual int local_size() const = 0;
  virtual int first_rank() const { return 0; }
  // Local rank `local`'s communicator over its backend; called on that rank's thread, every local
  // rank at once (NCCL's initialisation is itself a collective).
  virtual std::unique_ptr<Communicator> connect(int local, Backend& backend) = 0;
  // A rank failed inside a step: release the ranks that wait for it in a collective.
  virtual void abort(const std::string& why) = 0;
  // Once every rank has returned from the failed step: whether the group can run steps again.
  virtual bool reset() = 0;
};

// Which part of a parallel model one rank computes (docs/parallel.md): rank `rank` of `size`, with
// the communicator of its collectives (null when size is 1). Tensor parallelism splits heads, MLP
// columns, the vocabulary and the routed experts in contiguous parts; expert_parallel moves the
// routed experts' rows with all-to-all instead of reducing every rank's experts over all rows.
struct ShardSpec {
  int rank = 0;
  int size = 1;
  bool expert_parallel = false;
  Communicator* comm = nullptr;

  bool sharded() const { return size > 1; }
  // This rank's part [begin(n), end(n)) of n items: [n rank / size, n (rank + 1) / size).
  int64_t begin(int64_t n) const { return n * rank / size; }
  int64_t end(int64_t n) const { return n * (rank + 1) / size; }
};

// Checks shared by the implementations: equal element sizes and the sizes each operation implies.
void communicator_check(const char* op, const Tensor& in, const Tensor& out, int64_t in_parts, int64_t out_parts);

}  // namespace moet
