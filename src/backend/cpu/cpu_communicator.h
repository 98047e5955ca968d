// Collectives between ranks that are threads of one process (the CPU backend's tensor and expert
// parallelism, and the tests of the sharded forward): the ranks publish pointers to their tensors
// and meet at a barrier, then each reads what it needs from the others' memory. A sum is computed
// once per element, adding the ranks' values in rank order, so every rank gets the same bits and
// the result does not depend on which thread arrives first. A rank that fails inside a step calls
// abort(): the others, waiting in a collective or reaching one later, get an error instead of
// waiting forever; reset() (once every rank has returned) makes the group usable again.
#pragma once

#include "backend/communicator.h"

#include <memory>
#include <string>

namespace moet {

class CpuCommGroup final : public CommGroup {
 public:
  explicit CpuCommGroup(int size);
  ~CpuCommGroup() override;
  CpuCommGroup(const CpuCommGroup&) = delete;
  CpuCommGroup& operator=(const CpuCommGroup&) = delete;

  int size() const override;
  int local_size() const override { return size(); }
  // Rank `rank`'s communicator (one per rank; the group must outlive it).
  std::unique_ptr<Communicator> communicator(int rank);
  // The same for a CPU backend (the tensors must be host memory).
  std::unique_ptr<Communicator> connect(int local, Backend& backend) override;
  // Every collective waiting now or started later throws an error naming `why`, until reset().
  void abort(const std::string& why) override;
  // Clears an abort; only while no rank is inside a collective.
  bool reset() override;
  // The group's ranks [first, first + count) as a group of their own (local rank l = rank first +
  // l): the ranks of one "node" of a model split over nodes, all in this process (the tests of the
  // nodes' protocol, models/remote_nodes.h). This group must outlive it.
  std::unique_ptr<CommGroup> node(int first, int count);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace moet
