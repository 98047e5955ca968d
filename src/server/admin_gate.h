// The confidence gate's run-time endpoint (engine/confidence_gate.h): GET /admin/gate reports the
// gate's settings and tau; POST /admin/gate {"tau": T} sets tau (a number in [0, 1]; 0 turns the
// gate off) for the steps that start afterwards, without a restart. A bad body or value is a 400
// naming the field; a server without an FP4 tier answers 400 for any change. Behind the API key
// when one is set (http_server.cpp).
#pragma once

#include "server/http_types.h"
#include "server/server_context.h"

namespace moet::server {

void admin_gate_get(ServerContext& ctx, HttpExchange& ex);
void admin_gate_post(ServerContext& ctx, HttpExchange& ex);

}  // namespace moet::server
