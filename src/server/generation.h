// Answering a parsed generation request: submits its engine requests, then either waits for all
// choices and sends one JSON response, or streams Server-Sent Events ("data: {chunk}\n\n" per
// delta, an optional usage chunk, then "data: [DONE]"). A client that goes away (it closes its
// side, or a write fails) aborts the unfinished requests, streamed or not, which frees their KV
// blocks. When the server's drain timeout passes (HttpExchange::must_stop), the unfinished choices
// end with finish_reason "abort": a stream sends them, an error event and [DONE]; a non-streaming
// request gets a 503. Records TTFT, inter-token latency and finished-request metrics.
#pragma once

#include "server/openai_request.h"

#include "server/http_types.h"

namespace moet::server {

void respond_generation(ServerContext& ctx, GenerationJob job, HttpExchange& exchange);

}  // namespace moet::server
