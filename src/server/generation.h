// Answering a parsed generation request: submits its engine requests, then either waits for all
// choices and sends one JSON response, or streams Server-Sent Events ("data: {chunk}\n\n" per
// delta, an optional usage chunk, then "data: [DONE]"). A stream whose client went away (a failed
// write, or httplib giving up on the connection) aborts its unfinished requests, which frees their
// KV blocks. Records TTFT, inter-token latency and finished-request metrics.
#pragma once

#include "server/openai_request.h"

#include <httplib.h>

namespace moet::server {

void respond_generation(ServerContext& ctx, GenerationJob job, httplib::Response& res);

}  // namespace moet::server
