// ChoiceState: one choice of a completion or chat response, built from the engine's output deltas.
// apply() folds in a delta and returns what a stream sends for it (a completions choice with
// "text", or a chat choice with "delta": content / reasoning_content / tool_calls), or null when
// there is nothing to send yet; final() is the non-streaming choice. Chat text flows through the
// reasoning parser (if enabled) and then, when the request has tools, through a start-marker
// matcher: content before the tool-call marker streams, the rest is parsed when the choice ends
// and sent as complete tool_calls (finish_reason "tool_calls").
#pragma once

#include "engine/request.h"
#include "engine/stop_matcher.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "server/reasoning_parser.h"

#include <optional>

namespace moet::server {

class ChoiceState {
 public:
  // response_id names the response ("cmpl-..."); tool-call ids derive from it.
  ChoiceState(const ServerContext& ctx, const GenerationJob& job, int64_t index, std::string response_id);

  Json apply(const RequestOutput& out);
  Json final() const;

  bool finished() const { return finished_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_; }

 private:
  Json logprobs_json(const RequestOutput& out) const;
  void route_text(const std::string& text, ReasoningPiece& piece);
  Json finish_tools(Json& delta);
  Json tool_calls_json(bool with_index) const;

  const ServerContext& ctx_;
  bool chat_;
  int64_t index_;
  std::string response_id_;
  bool want_logprobs_;
  bool sent_role_ = false;
  std::string echo_;  // the prompt's text, until the first output carries it (completions, echo)
  std::optional<ReasoningParser> reasoning_;
  std::optional<StopMatcher> tool_start_;  // set when tool calls are parsed
  std::string tool_text_;                  // from the tool-call marker on
  std::vector<ToolCall> tool_calls_;
  // Accumulated for final().
  std::string text_, reasoning_text_;
  Json logprobs_;
  std::string finish_reason_;
  std::string stop_reason_;  // the stop string that ended the choice (vLLM's stop_reason)
  bool finished_ = false;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
};

}  // namespace moet::server
