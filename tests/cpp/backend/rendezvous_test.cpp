// The TCP rendezvous of a model split over nodes (backend/rendezvous.h), with two processes on this
// host (fork): node 1 receives exactly node 0's payload (an NCCL unique id's 128 bytes) whichever
// starts first; a node with another description or a node rank outside --nnodes is refused, and
// both sides say why; a node that cannot reach node 0 gives up after its timeout with a message
// naming --master-addr / --master-port. The connections stay open as node links (messages both ways).
#include "backend/rendezvous.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace moet {
namespace {

// A TCP port free on 127.0.0.1 right now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

// A node run in a child process: its rendezvous result ("ok:" + payload bytes, or "error:" + the
// message) comes back through a pipe.
class ChildNode {
 public:
  ChildNode(const RendezvousConfig& config, const std::string& description, int delay_ms = 0) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::string reply;
      try {
        RendezvousResult joined = rendezvous(config, description);
        reply = "ok:" + std::string(joined.payload.begin(), joined.payload.end());
        // Echo one message from node 0 back over the link, reversed.
        std::vector<uint8_t> message = joined.links.at(0).receive(10.0);
        std::reverse(message.begin(), message.end());
        joined.links.at(0).send(message);
      } catch (const std::exception& e) {
        reply = std::string("error:") + e.what();
      }
      const ssize_t written = ::write(fds[1], reply.data(), reply.size());
      ::_exit(written == ssize_t(reply.size()) ? 0 : 1);
    }
    ::close(fds[1]);
    read_fd_ = fds[0];
  }
  // What the child reported, once it has exited.
  std::string result() {
    std::string out;
    char buffer[4096];
    for (ssize_t n; (n = ::read(read_fd_, buffer, sizeof buffer)) > 0;) out.append(buffer, size_t(n));
    ::close(read_fd_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return out;
  }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
};

std::vector<uint8_t> id_bytes() {
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = uint8_t(i * 37 + 11);  // zeros and high bytes included
  id[5] = 0;
  return id;
}

TEST(Rendezvous, TwoProcessesShareNode0sId) {
  const std::vector<uint8_t> id = id_bytes();
  for (int child_delay : {0, 300}) {  // node 1 first (it retries), or node 0 first (it waits)
    const int port = free_port();
    ChildNode child({2, 1, "127.0.0.1", port, 10.0}, "model m, tp 2", child_delay);
    RendezvousResult mine = rendezvous({2, 0, "127.0.0.1", port, 10.0}, "model m, tp 2", id);
    EXPECT_EQ(mine.payload, id);
    ASSERT_EQ(mine.links.size(), 1u);
    const std::vector<uint8_t> message = {1, 2, 3, 0, 255};
    mine.links[0].send(message);
    EXPECT_EQ(mine.links[0].receive(10.0), (std::vector<uint8_t>{255, 0, 3, 2, 1}));
    EXPECT_EQ(child.result(), "ok:" + std::string(id.begin(), id.end()));
  }
}

TEST(Rendezvous, AnotherDescriptionIsRefusedOnBothSides) {
  const int port = free_port();
  ChildNode child({2, 1, "127.0.0.1", port, 10.0}, "model b");
  try {
    rendezvous({2, 0, "127.0.0.1", port, 10.0}, "model a", id_bytes());
    FAIL() << "node 0 accepted another description";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 runs 'model b' but node 0 runs 'model a'"), std::string::npos)
        << e.what();
  }
  const std::string reply = child.result();
  EXPECT_EQ(reply.rfind("error:rendezvous: node 0 refused node 1: node 1 runs 'model b'", 0), 0u) << reply;
}

TEST(Rendezvous, ANodeRankOutsideTheNodesIsRefused) {
  const int port = free_port();
  ChildNode child({3, 2, "127.0.0.1", port, 10.0}, "m");  // thinks there are 3 nodes
  EXPECT_THROW(
      {
        try {
          rendezvous({2, 0, "127.0.0.1", port, 10.0}, "m", id_bytes());
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--node-rank 2 (expected 1 to 1 for --nnodes 2)"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  EXPECT_EQ(child.result().rfind("error:rendezvous: node 0 refused node 2", 0), 0u);
}

TEST(Rendezvous, UnreachableNode0TimesOutWithAMessage) {
  const int port = free_port();  // nobody listens there
  const auto start = std::chrono::steady_clock::now();
  try {
    rendezvous({2, 1, "127.0.0.1", port, 0.5}, "m");
    FAIL() << "joined nobody";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 could not reach node 0 within 0.5 s"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--master-port " + std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(Rendezvous, OneNodeAndBadFlags) {
  const std::vector<uint8_t> id = id_bytes();
  EXPECT_EQ(rendezvous({1, 0, "127.0.0.1", 29500, 1.0}, "m", id).payload, id);  // nothing to meet
  EXPECT_THROW(rendezvous({2, 2, "127.0.0.1", 29500, 1.0}, "m"), Error);
  EXPECT_THROW(rendezvous({2, 1, "127.0.0.1", 0, 1.0}, "m"), Error);
}

}  // namespace
}  // namespace moet
