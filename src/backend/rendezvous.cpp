// The TCP rendezvous (see rendezvous.h). Messages are length-prefixed (u32, little-endian):
//   node -> node 0: "moet-rendezvous-1", node rank (u32), description
//   node 0 -> node: status (u32: 0 accepted, 1 refused), then the payload or the refusal's reason
// Every socket read and write is bounded by the remaining timeout (poll), so a node that never
// answers makes the other side fail with a message instead of hanging.
#include "backend/rendezvous.h"

#include "core/error.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

namespace moet {
namespace {

constexpr const char* kMagic = "moet-rendezvous-1";
constexpr uint32_t kMaxMessage = 64u << 20;

using Clock = std::chrono::steady_clock;

using Socket = NodeLink;

// Milliseconds left until `deadline` (at least 0).
int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, int64_t(1) << 30));
}

// Waits until fd is ready for `events` or the deadline passes (then throws naming `what`).
void wait_ready(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return;
    if (n == 0) fail("rendezvous: timed out {}", what);
    MOET_CHECK(errno == EINTR, "rendezvous: poll failed {}: {}", what, std::strerror(errno));
  }
}

void send_all(int fd, const void* data, size_t bytes, Clock::time_point deadline, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLOUT, deadline, what);
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    MOET_CHECK(n > 0, "rendezvous: sending failed {}: {}", what, n < 0 ? std::strerror(errno) : "connection closed");
    p += n;
    bytes -= size_t(n);
  }
}

void receive_all(int fd, void* data, size_t bytes, Clock::time_point deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLIN, deadline, what);
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    MOET_CHECK(n > 0, "rendezvous: receiving failed {}: {}", what, n < 0 ? std::strerror(errno) : "connection closed");
    p += n;
    bytes -= size_t(n);
  }
}

void send_u32(int fd, uint32_t value, Clock::time_point deadline, const std::string& what) {
  const uint8_t bytes[4] = {uint8_t(value), uint8_t(value >> 8), uint8_t(value >> 16), uint8_t(value >> 24)};
  send_all(fd, bytes, 4, deadline, what);
}

uint32_t receive_u32(int fd, Clock::time_point deadline, const std::string& what) {
  uint8_t b[4];
  receive_all(fd, b, 4, deadline, what);
  return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
}

void send_message(int fd, std::span<const uint8_t> bytes, Clock::time_point deadline, const std::string& what) {
  send_u32(fd, uint32_t(bytes.size()), deadline, what);
  send_all(fd, bytes.data(), bytes.size(), deadline, what);
}

std::vector<uint8_t> receive_message(int fd, Clock::time_point deadline, const std::string& what) {
  const uint32_t size = receive_u32(fd, deadline, what);
  MOET_CHECK(size <= kMaxMessage, "rendezvous: a message of {} bytes {} (not a moet rendezvous?)", size, what);
  std::vector<uint8_t> bytes(size);
  receive_all(fd, bytes.data(), size, deadline, what);
  return bytes;
}

std::span<const uint8_t> as_bytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

std::string as_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// The address of master_addr:master_port (IPv4 or IPv6, numeric or a name).
addrinfo* resolve(const RendezvousConfig& c, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(c.master_port);
  const int err = ::getaddrinfo(c.master_addr.c_str(), port.c_str(), &hints, &found);
  MOET_CHECK(err == 0 && found != nullptr, "--master-addr {}: cannot resolve it ({})", c.master_addr,
             gai_strerror(err));
  return found;
}

Socket listen_on(const RendezvousConfig& c) {
  addrinfo* address = resolve(c, true);
  Socket s(::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC, 0));
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok =
      s.fd() >= 0 && ::bind(s.fd(), address->ai_addr, address->ai_addrlen) == 0 && ::listen(s.fd(), 64) == 0;
  const int err = errno;
  ::freeaddrinfo(address);
  MOET_CHECK(ok, "--master-addr {} --master-port {}: node 0 cannot listen there: {}", c.master_addr, c.master_port,
             std::strerror(err));
  return s;
}

// Connects to node 0, retrying every 200 ms until the deadline (node 0 may start later).
Socket connect_to(const RendezvousConfig& c, Clock::time_point deadline) {
  std::string last = "no attempt";
  while (Clock::now() < deadline) {
    addrinfo* address = resolve(c, false);
    Socket s(::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC, 0));
    const bool ok = s.fd() >= 0 && ::connect(s.fd(), address->ai_addr, address->ai_addrlen) == 0;
    last = std::strerror(errno);
    ::freeaddrinfo(address);
    if (ok) {
      const int one = 1;
      ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200, remaining_ms(deadline))));
  }
  fail("--master-addr {} --master-port {}: node {} could not reach node 0 within {} s ({})", c.master_addr,
       c.master_port, c.node_rank, c.timeout_seconds, last);
}

RendezvousResult serve_nodes(const RendezvousConfig& c, const std::string& description,
                             std::span<const uint8_t> payload, Clock::time_point deadline) {
  Socket listener = listen_on(c);
  std::vector<Socket> nodes(size_t(c.nnodes));
  for (int joined = 1; joined < c.nnodes;) {
    wait_ready(listener.fd(), POLLIN, deadline,
               fmt::format("waiting for {} of {} nodes on port {}", c.nnodes - joined, c.nnodes - 1, c.master_port));
    Socket node(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (node.fd() < 0) continue;
    const std::string what = "with a joining node";
    const auto refuse = [&](const std::string& why) {
      send_u32(node.fd(), 1, deadline, what);
      send_message(node.fd(), as_bytes(why), deadline, what);
      fail("rendezvous: {}", why);
    };
    if (as_text(receive_message(node.fd(), deadline, what)) != kMagic)
      refuse(fmt::format("a connection to --master-port {} that is not a moet node", c.master_port));
    const uint32_t rank = receive_u32(node.fd(), deadline, what);
    const std::string theirs = as_text(receive_message(node.fd(), deadline, what));
    if (rank == 0 || rank >= uint32_t(c.nnodes))
      refuse(fmt::format("a node joined with --node-rank {} (expected 1 to {} for --nnodes {})", rank, c.nnodes - 1,
                         c.nnodes));
    if (nodes[rank].fd() >= 0) refuse(fmt::format("two nodes joined with --node-rank {}", rank));
    if (theirs != description)
      refuse(fmt::format("node {} runs '{}' but node 0 runs '{}'", rank, theirs, description));
    nodes[rank] = std::move(node);
    ++joined;
    MOET_LOG_INFO("rendezvous: node {} joined ({} of {})", rank, joined, c.nnodes);
  }
  RendezvousResult result{std::vector<uint8_t>(payload.begin(), payload.end()), {}};
  for (int r = 1; r < c.nnodes; ++r) {
    const std::string what = fmt::format("with node {}", r);
    send_u32(nodes[size_t(r)].fd(), 0, deadline, what);
    send_message(nodes[size_t(r)].fd(), payload, deadline, what);
    result.links.push_back(std::move(nodes[size_t(r)]));
  }
  return result;
}

RendezvousResult join_node0(const RendezvousConfig& c, const std::string& description, Clock::time_point deadline) {
  Socket s = connect_to(c, deadline);
  const std::string what = fmt::format("with node 0 at {}:{}", c.master_addr, c.master_port);
  send_message(s.fd(), as_bytes(kMagic), deadline, what);
  send_u32(s.fd(), uint32_t(c.node_rank), deadline, what);
  send_message(s.fd(), as_bytes(description), deadline, what);
  const uint32_t status = receive_u32(s.fd(), deadline, what);
  std::vector<uint8_t> reply = receive_message(s.fd(), deadline, what);
  MOET_CHECK(status == 0, "rendezvous: node 0 refused node {}: {}", c.node_rank, as_text(reply));
  RendezvousResult result{std::move(reply), {}};
  result.links.push_back(std::move(s));
  return result;
}

// A deadline `seconds` from now (<= 0: none in practice).
Clock::time_point deadline_in(double seconds) {
  return seconds > 0 ? Clock::now() + std::chrono::milliseconds(int64_t(seconds * 1000.0))
                     : Clock::now() + std::chrono::hours(24 * 365);
}

}  // namespace

NodeLink& NodeLink::operator=(NodeLink&& other) noexcept {
  std::swap(fd_, other.fd_);
  return *this;
}

NodeLink::~NodeLink() {
  if (fd_ >= 0) ::close(fd_);
}

void NodeLink::send(std::span<const uint8_t> message, double timeout_seconds) {
  MOET_CHECK(open(), "node link: sending on a closed link");
  MOET_CHECK(message.size() <= kMaxMessage, "node link: a message of {} bytes exceeds {}", message.size(), kMaxMessage);
  send_message(fd_, message, deadline_in(timeout_seconds), "on a node link");
}

std::vector<uint8_t> NodeLink::receive(double timeout_seconds) {
  MOET_CHECK(open(), "node link: receiving on a closed link");
  return receive_message(fd_, deadline_in(timeout_seconds), "on a node link");
}

std::pair<NodeLink, NodeLink> NodeLink::pair() {
  int fds[2];
  MOET_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair: {}", std::strerror(errno));
  return {NodeLink(fds[0]), NodeLink(fds[1])};
}

RendezvousResult rendezvous(const RendezvousConfig& c, const std::string& description,
                            std::span<const uint8_t> payload) {
  MOET_CHECK(c.nnodes >= 1, "--nnodes must be at least 1 (got {})", c.nnodes);
  MOET_CHECK(c.node_rank >= 0 && c.node_rank < c.nnodes, "--node-rank {} outside [0, {}) (--nnodes {})", c.node_rank,
             c.nnodes, c.nnodes);
  MOET_CHECK(c.master_port >= 1 && c.master_port <= 65535, "--master-port {} is not a TCP port", c.master_port);
  if (c.nnodes == 1) return {std::vector<uint8_t>(payload.begin(), payload.end()), {}};
  const Clock::time_point deadline = deadline_in(c.timeout_seconds);
  return c.node_rank == 0 ? serve_nodes(c, description, payload, deadline) : join_node0(c, description, deadline);
}

}  // namespace moet
