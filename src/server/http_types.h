// What the HTTP transport (http_transport.h) hands a handler and what a handler answers with,
// free of any HTTP library: a fully read request (headers and body within their limits), and an
// HttpExchange to answer it once, either with a whole response or as a chunked stream. Handlers
// run on worker threads; every HttpExchange method is safe to call from them. A stream's write()
// blocks until the bytes are on the socket (back-pressure from slow readers) and returns false
// once the client is gone; client_gone() also turns true while a handler is still working, when
// the client closes its side, so long non-streaming requests can be cancelled.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moet::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // target up to '?'
  std::string query;   // after '?', without it
  HttpHeaders headers;
  std::string body;
  std::string remote;  // "address:port" of the client
  bool keep_alive = true;

  // The first header of that name (case-insensitive); empty when absent.
  std::string header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // Sends a complete response; an exchange answers once (respond() or a stream).
  virtual void respond(HttpResponse response) = 0;
  // Starts a chunked response (status 200 with these headers); false when the client is gone.
  virtual bool start_stream(const std::string& content_type, const HttpHeaders& headers) = 0;
  // Sends one chunk; blocks until written. False when the client is gone or the write timed out.
  virtual bool write(std::string_view data) = 0;
  // Sends the terminating chunk.
  virtual void end_stream() = 0;
  // The client closed its side (or a write failed).
  virtual bool client_gone() const = 0;
  // The server is shutting down and its drain timeout has passed: end the response now.
  virtual bool must_stop() const = 0;
  // Headers added to whatever this exchange answers (CORS).
  virtual void add_header(std::string name, std::string value) = 0;
};

// Case-insensitive ASCII comparison (header names, tokens).
bool iequals(std::string_view a, std::string_view b);

}  // namespace moet::server
