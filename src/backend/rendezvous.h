// The rendezvous of a model split over nodes (docs/parallel.md), over TCP: node 0 listens on
// master_addr:master_port; every other node connects (retrying while node 0 is not up yet), names
// itself (its node rank) and what it is about to run (a description that must equal node 0's: the
// model, the split, the ranks per node), and receives node 0's payload: NCCL's unique id, from
// which NCCL's own bootstrap then connects every rank. Node 0 returns once every node has joined;
// a node that gives a wrong rank, a rank twice or another description is refused with a message
// that both sides report. No GPU is involved, so this is tested with processes on one host.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace moet {

struct RendezvousConfig {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_seconds = 300.0;  // how long node 0 waits for the others, and they for node 0
};

// Node 0: `payload` is what every node receives (and what it returns); other nodes pass nothing.
// Throws a one-line error naming --master-addr / --master-port / --node-rank on any failure.
std::vector<uint8_t> rendezvous(const RendezvousConfig& config, const std::string& description,
                                std::span<const uint8_t> payload = {});

}  // namespace moet
