// HttpTransport: HTTP/1.1 on Boost.Beast + Asio (Debian libboost-dev), event-driven. One I/O
// thread owns every socket; it reads requests with Beast's parser under hard limits and hands
// each complete request to a handler on a WorkerPool thread (http_types.h). Why not cpp-httplib:
// its blocking thread-per-connection model lets connections that trickle their headers hold every
// worker (docs/server.md, "HTTP layer").
// Invariants:
// - Reading costs no thread: a slow or idle connection only holds a socket and a timer. Headers
//   must arrive within header_timeout of the request's first byte (a deadline, not an idle
//   timer, so trickling does not extend it), the body within body_timeout, and an idle
//   keep-alive connection is closed after idle_timeout; a write that makes no progress for
//   write_timeout drops the client.
// - Limits apply before memory is spent: the request line + headers may take max_header_bytes
//   (431 beyond), the body max_body_bytes whether sent with Content-Length or chunked (413).
// - At most max_connections sockets are open. A new connection over the cap closes the oldest
//   one that is idle or still reading its request; admitted requests are never closed for it
//   (when every connection is busy, the newcomer gets a 503).
// - While a handler works, the connection keeps reading: the client's next pipelined bytes are
//   buffered, and end-of-stream or an error sets client_gone().
// - listen() binds exclusively (no SO_REUSEPORT): a second server on the port fails at once.
// - drain(): stops accepting, closes idle connections, answers new requests with 503, lets the
//   running exchanges finish for up to `timeout` seconds, then sets must_stop() on the rest and
//   gives them a few more seconds to end their responses. stop() ends the I/O thread.
#pragma once

#include "server/http_types.h"

#include <functional>
#include <memory>
#include <string>

namespace moet::server {

struct HttpLimits {
  size_t max_header_bytes = size_t(64) << 10;
  size_t max_body_bytes = size_t(8) << 20;
  double header_timeout = 10.0;  // seconds from a request's first byte to its last header byte
  double body_timeout = 60.0;    // seconds from the last header byte to the last body byte
  double idle_timeout = 60.0;    // seconds a keep-alive connection may wait for its next request
  double write_timeout = 60.0;   // seconds one write may take
  size_t max_connections = 4096;
};

using HttpHandler = std::function<void(HttpExchange&)>;

class HttpTransport {
 public:
  HttpTransport(HttpLimits limits, HttpHandler handler);
  ~HttpTransport();
  // Binds host:port (throws moet::Error naming the address when it cannot) and starts accepting
  // on the I/O thread; returns the bound port (useful with port 0).
  int listen(const std::string& host, int port);
  // Graceful shutdown (see above); returns once every connection is closed or the grace is over.
  void drain(double timeout_seconds);
  void stop();
  // Open connections and running exchanges (for tests and logs).
  size_t connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moet::server
