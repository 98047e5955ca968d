// The rendezvous of a model split over nodes (docs/parallel.md), over TCP: node 0 listens on
// master_addr:master_port; every other node connects (retrying while node 0 is not up yet), names
// itself (its node rank) and what it is about to run (a description that must equal node 0's: the
// model, the split, the ranks per node), and receives node 0's payload: NCCL's unique id, from
// which NCCL's own bootstrap then connects every rank. Node 0 returns once every node has joined;
// a node that gives a wrong rank, a rank twice or another description is refused with a message
// that both sides report. No GPU is involved, so this is tested with processes on one host. The
// connections stay open as NodeLinks: node 0 tells the other nodes every step over them
// (models/remote_nodes.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace moet {

// A message connection between node 0 and another node (a connected stream socket, owned):
// length-prefixed messages of at most 64 MiB.
class NodeLink {
 public:
  explicit NodeLink(int fd = -1) : fd_(fd) {}
  NodeLink(NodeLink&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  NodeLink& operator=(NodeLink&& other) noexcept;
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Sends one message (timeout_seconds <= 0: as long as it takes; a closed peer fails at once).
  void send(std::span<const uint8_t> message, double timeout_seconds = 60.0);
  // Waits for the next message (timeout_seconds <= 0: as long as it takes).
  std::vector<uint8_t> receive(double timeout_seconds = 0.0);
  // Two connected ends in this process (tests of the nodes' protocol without a network).
  static std::pair<NodeLink, NodeLink> pair();

 private:
  int fd_;
};

struct RendezvousResult {
  std::vector<uint8_t> payload;  // node 0's (NCCL's unique id)
  // Node 0: the links of nodes 1 .. nnodes - 1, in order; another node: its link to node 0.
  std::vector<NodeLink> links;
};

struct RendezvousConfig {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_seconds = 300.0;  // how long node 0 waits for the others, and they for node 0
};

// Node 0: `payload` is what every node receives (and what it returns); other nodes pass nothing.
// Throws a one-line error naming --master-addr / --master-port / --node-rank on any failure.
RendezvousResult rendezvous(const RendezvousConfig& config, const std::string& description,
                            std::span<const uint8_t> payload = {});

}  // namespace moet
