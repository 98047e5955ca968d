// GET / POST /admin/gate (see admin_gate.h).
#include "server/admin_gate.h"

#include "core/log.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace moet::server {
namespace {

Json gate_state(const ServerContext& ctx) {
  if (ctx.gate == nullptr) return {{"fp4_tier", false}, {"tau", 0.0}};
  const GateOptions& o = ctx.gate->options();
  return {{"fp4_tier", true},
          {"tau", ctx.gate->tau()},
          {"signal", gate_signal_name(o.signal)},
          {"rounds", o.rounds},
          {"budget", o.budget}};
}

void send(HttpExchange& ex, const Json& body) { ex.respond({200, "application/json", body.dump(), {}}); }

}  // namespace

void admin_gate_get(ServerContext& ctx, HttpExchange& ex) { send(ex, gate_state(ctx)); }

void admin_gate_post(ServerContext& ctx, HttpExchange& ex) {
  Json body;
  try {
    body = Json::parse(ex.request().body);
  } catch (const Json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  for (const auto& [key, value] : body.items())
    if (key != "tau") bad_request(key, "unknown field '{}' (the gate takes 'tau')", key);
  if (!json_has(body, "tau")) bad_request("tau", "'tau' is required");
  const double tau = json_number(body, "tau", 0.0);
  if (!(tau >= 0.0 && tau <= 1.0)) bad_request("tau", "'tau' must be in [0, 1] (got {})", tau);
  if (ctx.gate == nullptr) bad_request("tau", "this server has no FP4 tier (--fp4-pool-gb): there is no gate to set");
  ctx.gate->set_tau(tau);
  MOET_LOG_INFO("gate: tau {} (POST /admin/gate)", tau);
  send(ex, gate_state(ctx));
}

}  // namespace moet::server
