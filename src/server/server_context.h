// What every handler shares: the engine, the tokenizer and chat template, the server options, the
// metrics, the tool-call parser and the reasoning switch. Built once by the `serve` command; all
// members are either immutable after start or thread-safe.
#pragma once

#include "engine/async_engine.h"
#include "experts/gate_control.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/token_mask.h"
#include "server/tool_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moet::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_model_names;  // the first is reported by /v1/models
  std::string api_key;                          // empty: no authentication
  size_t max_request_bytes = size_t(8) << 20;
  HttpLimits http;                              // header size, timeouts, connection cap (body: max_request_bytes)
  std::vector<std::string> allowed_origins;     // CORS: origins answered with CORS headers ("*": any)
  std::string tool_call_parser = "auto";
  std::string reasoning_parser = "auto";
  SamplingParams default_sampling;              // from generation_config.json (temperature 1.0 otherwise)
};

struct ServerContext {
  AsyncEngine& engine;
  Tokenizer tokenizer;
  std::optional<ChatTemplate> chat_template;
  ServerOptions options;
  std::unique_ptr<ToolParser> tool_parser;  // nullptr: tool calls are not parsed
  bool reasoning = false;                   // split <think> blocks into reasoning_content
  std::vector<int32_t> eos_ids;
  int64_t created = 0;                      // unix time of the start (the model's "created")
  Metrics metrics;
  mutable GrammarCache grammars;            // compiled structured-output grammars, by source
  GateControl* gate = nullptr;              // the confidence gate's tau (null: no FP4 tier)

  const std::string& model_name() const { return options.served_model_names.front(); }
  int64_t max_model_len() const { return engine.config().max_model_len; }
};

}  // namespace moet::server
