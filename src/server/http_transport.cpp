// HttpTransport implementation (see http_transport.h). Everything a Connection owns (socket,
// timer, buffer, parser, phase) is touched on the I/O thread only; an Exchange (a handler's view,
// used from a worker thread) posts its writes to the I/O thread and waits for their completion.
// Requests are parsed by Beast's request_parser; responses are serialized by Beast too.
#include "server/http_transport.h"

#include "core/error.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/worker_pool.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <list>
#include <optional>
#include <thread>

namespace moet::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

namespace {

using Clock = std::chrono::steady_clock;

Clock::duration duration_of(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

enum class Phase { header, body, busy, idle, closed };

using BeastResponse = http::response<http::string_body>;

std::shared_ptr<BeastResponse> beast_response(const HttpResponse& r, const HttpHeaders& extra) {
  auto res = std::make_shared<BeastResponse>();
  res->version(11);
  res->result(unsigned(r.status));
  res->set(http::field::server, "moet");
  if (!r.content_type.empty()) res->set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : extra) res->insert(k, v);
  for (const auto& [k, v] : r.headers) res->insert(k, v);
  res->body() = r.body;
  res->prepare_payload();
  return res;
}

HttpResponse error_response(int status, const std::string& message) {
  return {status, "application/json", api_error_body(status, message).dump(), {}};
}

class Connection;

}  // namespace

struct HttpTransport::Impl {
  HttpLimits limits;
  HttpHandler handler;
  net::io_context io;
  net::executor_work_guard<net::io_context::executor_type> guard{net::make_work_guard(io)};
  tcp::acceptor acceptor{io};
  net::steady_timer accept_retry{io};
  std::thread thread;
  WorkerPool workers;
  std::list<std::shared_ptr<Connection>> connections;  // I/O thread only
  std::atomic<size_t> open{0};
  std::atomic<bool> draining{false}, stop_exchanges{false};

  Impl(HttpLimits l, HttpHandler h) : limits(l), handler(std::move(h)) {}
  void accept();
  void admit(tcp::socket socket);
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport::Impl& t, tcp::socket socket)
      : t_(t), socket_(std::move(socket)), deadline_(t.io) {}

  std::atomic<bool> gone{false};  // the client closed its side, or a write failed
  std::list<std::shared_ptr<Connection>>::iterator self;
  Clock::time_point since = Clock::now();  // start of the current phase

  HttpTransport::Impl& transport() { return t_; }
  bool evictable() const { return phase_ == Phase::idle || phase_ == Phase::header || phase_ == Phase::body; }
  bool busy() const { return phase_ == Phase::busy; }

  void start() {
    error_code ec;
    const tcp::endpoint peer = socket_.remote_endpoint(ec);
    if (!ec) remote_ = fmt::format("{}:{}", peer.address().to_string(), peer.port());
    socket_.set_option(tcp::no_delay(true), ec);  // SSE chunks must not wait for Nagle
    read_header();
  }

  void close() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    gone = true;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    deadline_.cancel();
    --t_.open;
    t_.connections.erase(self);  // may drop the last reference but one: callers hold their own
  }

  // --- used by Exchange, on the I/O thread ---
  void send_full(std::shared_ptr<BeastResponse> res, std::function<void(bool)> done) {
    if (phase_ == Phase::closed) return done(false);
    res->keep_alive(keep_alive_ && !t_.draining);
    set_deadline(t_.limits.write_timeout);
    http::async_write(socket_, *res, [self = shared_from_this(), res, done](error_code ec, size_t) {
      self->write_completed(ec);
      done(!ec);
    });
  }

  void send_head(std::shared_ptr<http::response<http::empty_body>> head, std::function<void(bool)> done) {
    if (phase_ == Phase::closed) return done(false);
    head->keep_alive(keep_alive_ && !t_.draining);
    auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    set_deadline(t_.limits.write_timeout);
    http::async_write_header(socket_, *serializer,
                             [self = shared_from_this(), head, serializer, done](error_code ec, size_t) {
                               self->write_completed(ec);
                               done(!ec);
                             });
  }

  void send_chunk(std::shared_ptr<std::string> data, std::function<void(bool)> done) {
    if (phase_ == Phase::closed) return done(false);
    set_deadline(t_.limits.write_timeout);
    net::async_write(socket_, http::make_chunk(net::buffer(*data)),
                     [self = shared_from_this(), data, done](error_code ec, size_t) {
                       self->write_completed(ec);
                       done(!ec);
                     });
  }

  void send_last(std::function<void(bool)> done) {
    if (phase_ == Phase::closed) return done(false);
    set_deadline(t_.limits.write_timeout);
    net::async_write(socket_, http::make_chunk_last(), [self = shared_from_this(), done](error_code ec, size_t) {
      self->write_completed(ec);
      done(!ec);
    });
  }

  // After the last byte of an exchange's response: the next request, or the end.
  void exchange_done() {
    if (phase_ == Phase::closed) return;
    if (!keep_alive_ || gone || t_.draining) return linger();
    phase_ = Phase::idle;
    since = Clock::now();
    if (buffer_.size() > 0 && !watching_) return read_header();  // a pipelined request is here
    watch();
    set_deadline(t_.limits.idle_timeout);
  }

 private:
  void set_deadline(double seconds) {
    deadline_.expires_after(duration_of(seconds));
    deadline_.async_wait([self = shared_from_this(), gen = ++deadline_gen_](error_code ec) {
      if (ec || gen != self->deadline_gen_) return;
      self->close();  // header/body/idle deadline passed, or a write made no progress
    });
  }
  void clear_deadline() {
    ++deadline_gen_;
    deadline_.cancel();
  }

  void write_completed(error_code ec) {
    if (phase_ == Phase::closed) return;
    clear_deadline();
    if (ec) gone = true;
  }

  void read_header() {
    phase_ = Phase::header;
    since = Clock::now();
    parser_.emplace();
    parser_->header_limit(std::uint32_t(std::min<size_t>(t_.limits.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(std::uint64_t(t_.limits.max_body_bytes));
    set_deadline(t_.limits.header_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (phase_ == Phase::closed) return;
    if (ec == http::error::header_limit)
      return reject(431, "the request line and headers exceed the server's limit (--max-header-bytes)");
    if (ec == http::error::body_limit) return reject(413, "the request body exceeds the server's limit (--max-request-bytes)");
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset)
      return close();
    if (ec) return reject(400, fmt::format("malformed HTTP request: {}", ec.message()));
    const auto& req = parser_->get();
    if (parser_->is_done()) return dispatch();
    phase_ = Phase::body;
    since = Clock::now();
    set_deadline(t_.limits.body_timeout);
    if (iequals(std::string(req[http::field::expect]), "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(socket_, net::buffer(kContinue), [self = shared_from_this()](error_code ec, size_t) {
        if (self->phase_ == Phase::closed) return;
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (self->phase_ == Phase::closed) return;
      if (ec == http::error::body_limit)
        return self->reject(413, "the request body exceeds the server's limit (--max-request-bytes)");
      if (ec) return self->close();
      self->dispatch();
    });
  }

  void dispatch();

  // An error answered before the request was read to its end: close after it (lingering, so the
  // client can read the answer while it is still sending).
  void reject(int status, const std::string& message) {
    clear_deadline();
    phase_ = Phase::busy;
    keep_alive_ = false;
    send_full(beast_response(error_response(status, message), {}),
              [self = shared_from_this()](bool) { self->exchange_done(); });
  }

  // Half-closes, then reads and drops whatever the client still sends (at most 5 s), then closes.
  void linger() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::busy;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec || watching_) return close();
    set_deadline(5.0);
    discard();
  }
  void discard() {
    static thread_local char sink[65536];
    socket_.async_read_some(net::buffer(sink), [self = shared_from_this()](error_code ec, size_t) {
      if (self->phase_ == Phase::closed) return;
      if (ec) return self->close();
      self->discard();
    });
  }

  // A read outside the parser while a handler runs or the connection is idle: buffers the next
  // request's first bytes, and notices a client that goes away.
  void watch() {
    if (watching_ || buffer_.size() > 0) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->watching_ = false;
      if (self->phase_ == Phase::closed) return;
      if (ec) {
        self->gone = true;
        if (self->phase_ == Phase::idle) self->close();
        return;
      }
      self->buffer_.commit(n);
      if (self->phase_ == Phase::idle) {
        self->clear_deadline();
        self->read_header();
      }
    });
  }

  HttpTransport::Impl& t_;
  tcp::socket socket_;
  net::steady_timer deadline_;
  uint64_t deadline_gen_ = 0;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::header;
  bool watching_ = false;
  bool keep_alive_ = true;
  std::string remote_;
};

// A handler's side of one request (see http_types.h). Used from one worker thread.
class Exchange final : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Connection> c, HttpRequest r) : conn_(std::move(c)), req_(std::move(r)) {}

  const HttpRequest& request() const override { return req_; }

  void respond(HttpResponse response) override {
    if (answered_) return;
    answered_ = true;
    auto res = beast_response(response, extra_);
    net::post(conn_->transport().io, [c = conn_, res] { c->send_full(res, [c](bool) { c->exchange_done(); }); });
  }

  bool start_stream(const std::string& content_type, const HttpHeaders& headers) override {
    if (answered_) return false;
    answered_ = streaming_ = true;
    auto head = std::make_shared<http::response<http::empty_body>>(http::status::ok, 11);
    head->set(http::field::server, "moet");
    head->set(http::field::content_type, content_type);
    for (const auto& [k, v] : extra_) head->insert(k, v);
    for (const auto& [k, v] : headers) head->insert(k, v);
    head->chunked(true);
    return run([head](Connection& c, std::function<void(bool)> done) { c.send_head(head, std::move(done)); });
  }

  bool write(std::string_view data) override {
    if (!streaming_ || ended_ || failed_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    auto bytes = std::make_shared<std::string>(data);
    return run([bytes](Connection& c, std::function<void(bool)> done) { c.send_chunk(bytes, std::move(done)); });
  }

  void end_stream() override {
    if (!streaming_ || ended_) return;
    ended_ = true;
    net::post(conn_->transport().io, [c = conn_] { c->send_last([c](bool) { c->exchange_done(); }); });
  }

  bool client_gone() const override { return failed_ || conn_->gone.load(); }
  bool must_stop() const override { return conn_->transport().stop_exchanges.load(); }
  void add_header(std::string name, std::string value) override { extra_.emplace_back(std::move(name), std::move(value)); }

  // After the handler returned: whatever it left unanswered is answered.
  void finish() {
    if (!answered_) respond(error_response(500, "internal error: the handler sent no response"));
    else if (streaming_ && !ended_) end_stream();
  }

 private:
  // Runs op on the I/O thread and waits for its completion (bounded, in case the loop is gone).
  bool run(std::function<void(Connection&, std::function<void(bool)>)> op) {
    if (failed_) return false;
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> result = done->get_future();
    net::post(conn_->transport().io, [c = conn_, op = std::move(op), done] {
      op(*c, [done](bool ok) { done->set_value(ok); });
    });
    const double limit = conn_->transport().limits.write_timeout + 5.0;
    if (result.wait_for(duration_of(limit)) != std::future_status::ready || !result.get()) failed_ = true;
    return !failed_;
  }

  std::shared_ptr<Connection> conn_;
  HttpRequest req_;
  HttpHeaders extra_;
  bool answered_ = false, streaming_ = false, ended_ = false, failed_ = false;
};

void Connection::dispatch() {
  clear_deadline();
  phase_ = Phase::busy;
  since = Clock::now();
  auto& msg = parser_->get();
  keep_alive_ = msg.keep_alive();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  const size_t q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& field : msg) req.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  req.body = std::move(msg.body());
  req.remote = remote_;
  req.keep_alive = keep_alive_;
  parser_.reset();
  if (t_.draining) {
    keep_alive_ = false;
    send_full(beast_response(error_response(503, "the server is shutting down"), {}),
              [self = shared_from_this()](bool) { self->exchange_done(); });
    return;
  }
  watch();
  auto exchange = std::make_shared<Exchange>(shared_from_this(), std::move(req));
  t_.workers.submit([exchange, &t = t_] {
    t.handler(*exchange);
    exchange->finish();
  });
}

}  // namespace

void HttpTransport::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {  // e.g. out of file descriptors: retry shortly instead of spinning
      MOET_LOG_WARN("accept: {}", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](error_code) { accept(); });
      return;
    }
    admit(std::move(socket));
    accept();
  });
}

void HttpTransport::Impl::admit(tcp::socket socket) {
  if (connections.size() >= limits.max_connections) {
    std::shared_ptr<Connection> victim;
    for (const auto& c : connections)
      if (c->evictable() && (!victim || c->since < victim->since)) victim = c;
    if (victim) {
      victim->close();
    } else {  // every connection carries an admitted request: refuse the newcomer
      static const std::string body = api_error_body(503, "too many connections; retry later").dump();
      static const std::string reply = fmt::format(
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
          "Connection: close\r\n\r\n{}", body.size(), body);
      (void)::send(socket.native_handle(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      error_code ec;
      socket.close(ec);
      return;
    }
  }
  auto c = std::make_shared<Connection>(*this, std::move(socket));
  connections.push_back(c);
  c->self = std::prev(connections.end());
  ++open;
  c->start();
}

HttpTransport::HttpTransport(HttpLimits limits, HttpHandler handler)
    : impl_(std::make_unique<Impl>(limits, std::move(handler))) {}

HttpTransport::~HttpTransport() {
  impl_->stop_exchanges = true;
  impl_->workers.wait_idle(impl_->limits.write_timeout + 10.0);
  stop();
}

int HttpTransport::listen(const std::string& host, int port) {
  Impl& im = *impl_;
  error_code ec;
  tcp::resolver resolver(im.io);
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) fail("cannot resolve --host '{}': {}", host, ec.message());
  const tcp::endpoint endpoint = *results.begin();
  im.acceptor.open(endpoint.protocol(), ec);
  if (!ec) im.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);  // not SO_REUSEPORT
  if (!ec) im.acceptor.bind(endpoint, ec);
  if (!ec) im.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on {}:{}: {}", host, port, ec.message());
  const int bound = im.acceptor.local_endpoint().port();
  im.accept();
  im.thread = std::thread([&im] {
    while (true) {
      try {
        im.io.run();
        return;
      } catch (const std::exception& e) {
        MOET_LOG_ERROR("HTTP I/O thread: {}", e.what());
      }
    }
  });
  return bound;
}

void HttpTransport::drain(double timeout_seconds) {
  Impl& im = *impl_;
  net::post(im.io, [&im] {
    im.draining = true;
    error_code ec;
    im.acceptor.close(ec);
    std::vector<std::shared_ptr<Connection>> idle;
    for (const auto& c : im.connections)
      if (c->evictable()) idle.push_back(c);
    for (const auto& c : idle) c->close();
  });
  const auto wait_closed = [&](double seconds) {
    const auto until = Clock::now() + duration_of(seconds);
    while (im.open.load() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return im.open.load() == 0;
  };
  if (wait_closed(timeout_seconds)) return;
  MOET_LOG_WARN("shutdown: {} connection(s) still busy after {} s; ending their responses", im.open.load(),
                timeout_seconds);
  im.stop_exchanges = true;
  wait_closed(5.0);
  im.workers.wait_idle(5.0);
}

void HttpTransport::stop() {
  Impl& im = *impl_;
  net::post(im.io, [&im] {
    error_code ec;
    im.acceptor.close(ec);
    im.accept_retry.cancel();
    std::vector<std::shared_ptr<Connection>> all(im.connections.begin(), im.connections.end());
    for (const auto& c : all) c->close();
    im.guard.reset();
  });
  if (im.thread.joinable()) im.thread.join();
}

size_t HttpTransport::connections() const { return impl_->open.load(); }

}  // namespace moet::server
