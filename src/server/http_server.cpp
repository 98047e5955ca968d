// HttpServer implementation (see http_server.h). handle() runs on a worker thread per request:
// CORS, authentication, routing (404/405), the route's handler, errors as OpenAI JSON, then one
// log line and one metrics count from whatever status the exchange answered with.
#include "server/http_server.h"

#include "core/log.h"
#include "server/admin_gate.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/generation.h"
#include "server/http_transport.h"
#include "server/openai_request.h"
#include "server/static_files.h"

#include <algorithm>
#include <functional>

namespace moet::server {
namespace {

std::string dump(const Json& body) { return body.dump(-1, ' ', false, Json::error_handler_t::replace); }

void send_json(HttpExchange& ex, const Json& body, int status = 200) {
  ex.respond({status, "application/json", dump(body), {}});
}

// Forwards to the transport's exchange and remembers the status it answered with.
class RecordingExchange final : public HttpExchange {
 public:
  explicit RecordingExchange(HttpExchange& inner) : inner_(inner) {}
  const HttpRequest& request() const override { return inner_.request(); }
  void respond(HttpResponse r) override {
    if (status_ == 0) status_ = r.status;
    inner_.respond(std::move(r));
  }
  bool start_stream(const std::string& type, const HttpHeaders& headers) override {
    if (status_ == 0) status_ = 200;
    return inner_.start_stream(type, headers);
  }
  bool write(std::string_view data) override { return inner_.write(data); }
  void end_stream() override { inner_.end_stream(); }
  bool client_gone() const override { return inner_.client_gone(); }
  bool must_stop() const override { return inner_.must_stop(); }
  void add_header(std::string name, std::string value) override { inner_.add_header(std::move(name), std::move(value)); }
  int status() const { return status_; }

 private:
  HttpExchange& inner_;
  int status_ = 0;
};

Json parse_body(const HttpRequest& req) {
  try {
    return Json::parse(req.body);
  } catch (const Json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
}

Json parse_object_body(const HttpRequest& req) {
  Json body = parse_body(req);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return body;
}

Json model_card(const ServerContext& ctx, const std::string& name) {
  return {{"id", name},           {"object", "model"}, {"created", ctx.created},
          {"owned_by", "moet"},   {"root", name},      {"max_model_len", ctx.max_model_len()}};
}

using RouteFn = std::function<void(ServerContext&, HttpExchange&)>;

struct Route {
  const char* method;
  std::string path;
  bool prefix;  // path is a prefix ("/v1/models/" + id)
  RouteFn fn;
};

void tokenize(ServerContext& ctx, HttpExchange& ex) {
  const Json body = parse_object_body(ex.request());
  check_model(body, ctx);
  std::vector<int32_t> tokens;
  if (json_has(body, "messages")) {
    tokens = ctx.tokenizer.encode(render_chat_prompt(body, ctx).text, false);
  } else {
    tokens = ctx.tokenizer.encode(json_string(body, "prompt", ""), json_bool(body, "add_special_tokens", true));
  }
  send_json(ex, {{"count", tokens.size()}, {"max_model_len", ctx.max_model_len()}, {"tokens", tokens}});
}

void detokenize(ServerContext& ctx, HttpExchange& ex) {
  const Json body = parse_object_body(ex.request());
  check_model(body, ctx);
  const Json* ids = json_array(body, "tokens");
  if (!ids) bad_request("tokens", "'tokens' is required");
  const int64_t vocab = int64_t(ctx.tokenizer.vocab_size());
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < ids->size(); ++i) {
    const Json& id = (*ids)[i];
    if (!id.is_number_integer()) bad_request("tokens", "'tokens' must be an array of integers");
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v >= vocab || !ctx.tokenizer.id_to_token(int32_t(v)))
      bad_request("tokens", "tokens[{}] = {} is not a token id of this model (vocabulary [0, {}))", i, v, vocab);
    tokens.push_back(int32_t(v));
  }
  send_json(ex, {{"prompt", ctx.tokenizer.decode(tokens, false)}});
}

const std::vector<Route>& routes() {
  static const std::vector<Route> table = {
      {"GET", "/health", false, [](ServerContext&, HttpExchange& ex) { ex.respond({200, "", "", {}}); }},
      {"GET", "/version", false, [](ServerContext&, HttpExchange& ex) { send_json(ex, {{"version", "0.1.0"}}); }},
      {"GET", "/v1/models", false,
       [](ServerContext& ctx, HttpExchange& ex) {
         Json data = Json::array();
         for (const std::string& name : ctx.options.served_model_names) data.push_back(model_card(ctx, name));
         send_json(ex, {{"object", "list"}, {"data", data}});
       }},
      {"GET", "/v1/models/", true,
       [](ServerContext& ctx, HttpExchange& ex) {
         const std::string id = ex.request().path.substr(std::string("/v1/models/").size());
         const auto& names = ctx.options.served_model_names;
         if (std::find(names.begin(), names.end(), id) == names.end())
           throw ApiError(404, fmt::format("The model `{}` does not exist.", id), "model", "model_not_found");
         send_json(ex, model_card(ctx, id));
       }},
      {"GET", "/metrics", false,
       [](ServerContext& ctx, HttpExchange& ex) {
         EngineStats stats = ctx.engine.stats();  // a snapshot after the last step; tau as it is now
         if (stats.fp4 && ctx.gate) stats.fp4->tau = ctx.gate->tau();
         std::string text = ctx.metrics.render(stats);
         text += fmt::format(
             "# HELP moet:structured_output_cache_hits_total Structured-output requests whose compiled grammar was "
             "cached.\n# TYPE moet:structured_output_cache_hits_total counter\n"
             "moet:structured_output_cache_hits_total {}\n"
             "# HELP moet:structured_output_cache_misses_total Structured-output requests that compiled a grammar.\n"
             "# TYPE moet:structured_output_cache_misses_total counter\nmoet:structured_output_cache_misses_total {}\n",
             ctx.grammars.hits(), ctx.grammars.misses());
         ex.respond({200, "text/plain; version=0.0.4; charset=utf-8", std::move(text), {}});
       }},
      {"POST", "/v1/completions", false,
       [](ServerContext& ctx, HttpExchange& ex) {
         respond_generation(ctx, parse_completion_request(parse_body(ex.request()), ctx), ex);
       }},
      {"POST", "/v1/chat/completions", false,
       [](ServerContext& ctx, HttpExchange& ex) {
         respond_generation(ctx, parse_chat_request(parse_body(ex.request()), ctx), ex);
       }},
      {"POST", "/tokenize", false, tokenize},
      {"POST", "/detokenize", false, detokenize},
      {"GET", "/admin/gate", false, admin_gate_get},
      {"POST", "/admin/gate", false, admin_gate_post},
  };
  return table;
}

bool authorized(const ServerContext& ctx, const HttpRequest& req) {
  if (ctx.options.api_key.empty() || !(req.path.starts_with("/v1/") || req.path.starts_with("/admin/"))) return true;
  return req.header("Authorization") == "Bearer " + ctx.options.api_key;
}

// CORS: adds the headers for an allowed Origin; answers a preflight. True when the request is done.
bool handle_cors(const ServerContext& ctx, HttpExchange& ex) {
  const HttpRequest& req = ex.request();
  const std::string origin = req.header("Origin");
  const auto& allowed = ctx.options.allowed_origins;
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  const bool ok = !origin.empty() && (any || std::find(allowed.begin(), allowed.end(), origin) != allowed.end());
  const bool preflight = req.method == "OPTIONS" && !req.header("Access-Control-Request-Method").empty();
  if (ok) {
    ex.add_header("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) ex.add_header("Vary", "Origin");
  }
  if (!preflight) return false;
  if (!ok) {
    send_json(ex, api_error_body(403, fmt::format("origin '{}' is not allowed (--allowed-origins)", origin)), 403);
    return true;
  }
  ex.respond({204, "", "", {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                            {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                            {"Access-Control-Max-Age", "600"}}});
  return true;
}

void route(ServerContext& ctx, HttpExchange& ex) {
  const HttpRequest& req = ex.request();
  if (handle_cors(ctx, ex)) return;
  if (!authorized(ctx, req)) {
    send_json(ex, api_error_body(401, "Incorrect API key provided.", {}, "invalid_api_key"), 401);
    return;
  }
  if (req.method == "GET" && serve_static_file(req.path, ex)) return;
  std::string allow;
  for (const Route& r : routes()) {
    const bool match = r.prefix ? req.path.starts_with(r.path) && req.path.size() > r.path.size() : req.path == r.path;
    if (!match) continue;
    if (req.method == r.method) return r.fn(ctx, ex);
    allow += (allow.empty() ? "" : ", ") + std::string(r.method);
  }
  if (!allow.empty()) {
    ex.respond({405, "application/json",
                dump(api_error_body(405, fmt::format("{} is not allowed on {} (use {})", req.method, req.path, allow))),
                {{"Allow", allow}}});
    return;
  }
  send_json(ex, api_error_body(404, fmt::format("no such endpoint: {} {}", req.method, req.path)), 404);
}

}  // namespace

HttpServer::HttpServer(ServerContext& ctx) : ctx_(ctx) {
  HttpLimits limits = ctx.options.http;
  limits.max_body_bytes = ctx.options.max_request_bytes;
  transport_ = std::make_unique<HttpTransport>(limits, [this](HttpExchange& ex) { handle(ex); });
}

HttpServer::~HttpServer() = default;

void HttpServer::handle(HttpExchange& inner) {
  RecordingExchange ex(inner);
  const HttpRequest& req = ex.request();
  try {
    route(ctx_, ex);
  } catch (const ApiError& e) {
    send_json(ex, e.body(), e.status());
  } catch (const Error& e) {  // validation below the server: the client's mistake
    send_json(ex, api_error_body(400, e.what()), 400);
  } catch (const std::exception& e) {
    MOET_LOG_ERROR("{} {}: {}", req.method, req.path, e.what());
    send_json(ex, api_error_body(500, fmt::format("internal error: {}", e.what())), 500);
  }
  const int status = ex.status() ? ex.status() : 500;
  ctx_.metrics.http_response(status);
  if (req.path != "/metrics" && req.path != "/health")
    MOET_LOG_INFO("{} {} {} {}", req.remote, req.method, req.path, status);
}

int HttpServer::listen() {
  const int port = transport_->listen(ctx_.options.host, ctx_.options.port);
  MOET_LOG_INFO("serving {} on http://{}:{} (OpenAI API at /v1, chat page at /)", ctx_.model_name(),
                ctx_.options.host, port);
  return port;
}

void HttpServer::drain(double timeout_seconds) { transport_->drain(timeout_seconds); }

void HttpServer::stop() { transport_->stop(); }

}  // namespace moet::server
