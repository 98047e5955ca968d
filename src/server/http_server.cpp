// HttpServer implementation (see http_server.h).
#include "server/http_server.h"

#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/generation.h"
#include "server/openai_request.h"

#include <httplib.h>

#include <chrono>

namespace moet::server {
namespace {

void send_json(httplib::Response& res, const Json& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const Json& body) {
  res.set_header("Connection", "close");  // the body may be unread (413); never reuse the connection
  send_json(res, body, status);
}

Json parse_body(const httplib::Request& req) {
  try {
    return Json::parse(req.body);
  } catch (const Json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
}

bool authorized(const ServerContext& ctx, const httplib::Request& req) {
  if (ctx.options.api_key.empty() || !req.path.starts_with("/v1/")) return true;
  return req.get_header_value("Authorization") == "Bearer " + ctx.options.api_key;
}

}  // namespace

HttpServer::HttpServer(ServerContext& ctx) : ctx_(ctx), http_(std::make_unique<httplib::Server>()) {
  // A stream holds its thread, so there is one per possible running request plus spares.
  const int threads = int(ctx.engine.config().max_num_seqs) + 16;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(ctx.options.max_request_bytes);
  http_->set_read_timeout(60, 0);
  http_->set_write_timeout(60, 0);
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(ctx_, req)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, api_error_body(401, "Incorrect API key provided.", {}, "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  http_->set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.body());
    } catch (const Error& e) {  // validation below the server: the client's mistake
      send_error(res, 400, api_error_body(400, e.what()));
    } catch (const std::exception& e) {
      MOET_LOG_ERROR("{} {}: {}", req.method, req.path, e.what());
      send_error(res, 500, api_error_body(500, fmt::format("internal error: {}", e.what())));
    }
  });
  http_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const int status = res.status;
    const std::string message = status == 413 ? "the request body exceeds the server's limit (--max-request-bytes)"
                                : status == 404 ? "no such endpoint"
                                                : fmt::format("HTTP {}", status);
    send_error(res, status, api_error_body(status, message));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    ctx_.metrics.http_response(res.status);
    if (req.path != "/metrics" && req.path != "/health")
      MOET_LOG_INFO("{} {} {} {}", req.remote_addr, req.method, req.path, res.status);
  });
  add_routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::add_routes() {
  httplib::Server& h = *http_;
  h.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  h.Get("/version", [](const httplib::Request&, httplib::Response& res) { send_json(res, {{"version", "0.1.0"}}); });
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Json data = Json::array();
    for (const std::string& name : ctx_.options.served_model_names)
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", ctx_.created},
                      {"owned_by", "moet"},
                      {"root", name},
                      {"max_model_len", ctx_.max_model_len()}});
    send_json(res, {{"object", "list"}, {"data", data}});
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ctx_.metrics.render(ctx_.engine.stats()), "text/plain; version=0.0.4; charset=utf-8");
  });
  h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    respond_generation(ctx_, parse_completion_request(parse_body(req), ctx_), res);
  });
  h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    respond_generation(ctx_, parse_chat_request(parse_body(req), ctx_), res);
  });
  h.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const Json body = parse_body(req);
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    check_model(body, ctx_);
    std::vector<int32_t> tokens;
    if (json_has(body, "messages")) {
      tokens = ctx_.tokenizer.encode(render_chat_prompt(body, ctx_).text, false);
    } else {
      tokens = ctx_.tokenizer.encode(json_string(body, "prompt", ""), json_bool(body, "add_special_tokens", true));
    }
    send_json(res, {{"count", tokens.size()}, {"max_model_len", ctx_.max_model_len()}, {"tokens", tokens}});
  });
  h.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const Json body = parse_body(req);
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    check_model(body, ctx_);
    const Json* ids = json_array(body, "tokens");
    if (!ids) bad_request("tokens", "'tokens' is required");
    std::vector<int32_t> tokens;
    for (const Json& id : *ids) {
      if (!id.is_number_integer()) bad_request("tokens", "'tokens' must be an array of integers");
      tokens.push_back(id.get<int32_t>());
    }
    send_json(res, {{"prompt", ctx_.tokenizer.decode(tokens, false)}});
  });
}

void HttpServer::serve() {
  if (!http_->bind_to_port(ctx_.options.host, ctx_.options.port))
    fail("cannot listen on {}:{} (address in use or not available)", ctx_.options.host, ctx_.options.port);
  MOET_LOG_INFO("serving {} on http://{}:{} (OpenAI API at /v1)", ctx_.model_name(), ctx_.options.host,
                ctx_.options.port);
  http_->listen_after_bind();
}

void HttpServer::stop() { http_->stop(); }

}  // namespace moet::server
