// The OpenAI-compatible HTTP server on cpp-httplib. Routes: GET /health, /version, /v1/models,
// /metrics; POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize. With an API key,
// /v1/* requires "Authorization: Bearer KEY" (401 otherwise). Bodies over max_request_bytes get a
// 413; every error is OpenAI's error JSON. HTTP threads only parse, submit to the engine and
// relay its outputs; a stream holds its thread until it ends. serve() blocks until stop().
#pragma once

#include "server/server_context.h"

#include <memory>

namespace httplib {
class Server;
}

namespace moet::server {

class HttpServer {
 public:
  explicit HttpServer(ServerContext& ctx);
  ~HttpServer();
  // Binds host:port and serves until stop(); throws moet::Error when the address cannot be bound.
  void serve();
  void stop();

 private:
  void add_routes();

  ServerContext& ctx_;
  std::unique_ptr<httplib::Server> http_;
};

}  // namespace moet::server
