// The OpenAI-compatible HTTP server: routes on top of HttpTransport (http_transport.h).
// GET /health, /version, /v1/models, /v1/models/{id}, /metrics, the chat page (/ and its files);
// POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize. A known path with the wrong
// method is a 405 (with Allow); an unknown one a 404. With an API key, /v1/* requires
// "Authorization: Bearer KEY" (401). With --allowed-origins, requests from those origins get CORS
// headers and preflights (OPTIONS) are answered. Every error is OpenAI's error JSON; every
// response is logged once and counted once in moet:http_requests_total by its status.
#pragma once

#include "server/server_context.h"

#include <memory>

namespace moet::server {

class HttpTransport;
class HttpExchange;

class HttpServer {
 public:
  explicit HttpServer(ServerContext& ctx);
  ~HttpServer();
  // Binds host:port and serves in the background; throws moet::Error when the address cannot be
  // bound (in use, or not available). Returns the bound port.
  int listen();
  // Graceful shutdown: stop accepting, let running requests finish within timeout_seconds, then
  // end the remaining streams with an error event and [DONE] (http_transport.h, drain()).
  void drain(double timeout_seconds);
  void stop();

 private:
  void handle(HttpExchange& exchange);

  ServerContext& ctx_;
  std::unique_ptr<HttpTransport> transport_;
};

}  // namespace moet::server
